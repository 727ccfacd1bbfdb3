"""Shared test values for the store suite: a deterministic clock, sample digests and run parameters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from alignflow import pipeline
from alignflow.config.experiment import Experiment, load_experiment
from alignflow.config.hosts import Inventory
from alignflow.config.placement import place
from alignflow.store.params import RunOptions, RunParams
from alignflow.store.records import ArtifactRef


class TickingClock:
    """A clock that advances one second per reading, so that order by time is deterministic in tests."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


CONFIG = {"name": "demo", "model": {"hidden_size": 64}}
CONFIG_SHA = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64
BASE = ArtifactRef(name="base_ckpt", host="ascend", path="/w/ascend/artifacts/base", sha256=SHA_B, size=2048,
                   kind="checkpoint", manifest=[["model.safetensors", SHA_B, 2048]])


@cache
def _tiny() -> tuple[Experiment, Inventory]:
    experiment = load_experiment(Path(__file__).parents[1] / "data" / "flow" / "tiny.yaml")
    inventory = Inventory.model_validate({"hosts": {name: {"role": name, "transport": "local",
                                                           "workdir": f"/state/hosts/{name}"}
                                                    for name in ("ascend", "cpu", "cuda")}})
    return experiment, inventory.model_copy(update={"source": "/state/hosts.yaml"})


def run_params(experiment: str = "demo", **options: Any) -> RunParams:
    """Valid parameters of an alignment run (tests/data/flow/tiny.yaml named `experiment`, on three local hosts),
    for tests of what the store does with runs rather than with their parameters."""
    tiny, inventory = _tiny()
    named = tiny.model_copy(update={"name": experiment})
    return RunParams(experiment_path=str(tiny.source), hosts_path=str(inventory.source), state_dir="/state",
                     experiment=named, inventory=inventory, options=RunOptions(**options),
                     plan=pipeline.DEFAULT.plan(), placement=place(named, inventory, state_dir=Path("/state")))
