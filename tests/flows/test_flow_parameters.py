"""The alignment flow's parameters reach Prefect as Prefect's own encoder would send them, without importing FastAPI
for it when they are JSON already (issue 48)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import pytest
from prefect import Flow

from flows.alignment import alignment


class Kind(enum.Enum):
    A = "a"


@pytest.mark.parametrize("parameters", [
    {"experiment": "experiments/demo.yaml", "hosts": "hosts.yaml", "from_step": None, "only": [],
     "force": ["gpu_train"], "parent_run": None, "reuse_parent": False, "trigger": "cli", "run_id": "abc123"},
    {"experiment": Path("experiments/demo.yaml"), "only": ("a", "b")},  # not JSON: Prefect's encoder
    {"experiment": "demo", "force": [Kind.A]},
])
def test_parameters_are_sent_as_prefects_encoder_sends_them(parameters: dict[str, Any]) -> None:
    assert alignment.serialize_parameters(parameters) == Flow.serialize_parameters(alignment, parameters)
