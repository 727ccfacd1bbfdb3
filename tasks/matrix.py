"""The switch matrix of a flow run: the core's `matrix_of`, with the flow's store, transports and scheduler."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.run import matrix_of
from alignflow.runner.session import Events
from alignflow.runner.walk import WalkResult
from tasks.context import open_store, state_dir, transport_factory


def matrix_verdict(run_id: str, result: WalkResult, available: Mapping[str, ArtifactRef],
                   scheduler_for: Callable[[str], Any], events: Events) -> str:
    """Train and compare the matrix of run `run_id` (each child run's steps through `scheduler_for(child)`: the
    flow's task scheduler); the run's verdict."""
    return matrix_of(run_id, result, available, store=open_store(), state_dir=state_dir(),
                     transport_factory=transport_factory(), scheduler_for=scheduler_for, events=events)
