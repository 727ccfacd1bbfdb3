"""Preflight of the parallel layouts: each side's read from its command, and the global batch must fit it."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config.experiment import Experiment, load_experiment
from alignflow.config.hosts import Inventory
from alignflow.config.parallel import ParallelConfig
from alignflow.preflight import check_experiment


@pytest.fixture
def dp2(repo_root: Path) -> tuple[Experiment, Inventory]:
    exp = load_experiment(repo_root / "experiments" / "demo.yaml")
    training = exp.training.model_copy(update={"micro_batch_size": 2})
    exp = exp.model_copy(update={"training": training,
                                 "gpu": exp.gpu.model_copy(update={"parallel": ParallelConfig(dp=2)})})
    inventory = Inventory.model_validate({"hosts": {
        "ascend": {"role": "ascend", "workdir": "/w"}, "cpu": {"role": "cpu", "workdir": "/w"},
        "cuda": {"role": "cuda", "workdir": "/w", "devices": 2}}})
    return exp, inventory


def _finding(report: object, setting: str) -> object:
    return next(f for f in report.findings if f.setting == setting)  # type: ignore[attr-defined]


def test_each_sides_layout_is_read_from_what_it_runs(dp2: tuple[Experiment, Inventory]) -> None:
    exp, inventory = dp2
    report = check_experiment(exp, inventory=inventory)
    assert report.ok, report.summary()
    world, dp, fits = (_finding(report, s) for s in ("parallel.world", "parallel.dp", "parallel.batch_fits"))
    assert (world.npu.value, world.gpu.value) == (1, 2)  # type: ignore[attr-defined]
    assert world.gpu.source == "torchrun --nproc_per_node 2 --nnodes 1"  # type: ignore[attr-defined]
    assert (dp.npu.value, dp.gpu.value) == (1, 2)  # type: ignore[attr-defined]
    assert fits.npu.source == "global batch 4 = micro batch 2 x dp 1 x 2 accumulation step(s)"  # type: ignore[attr-defined]
    assert fits.gpu.source == "global batch 4 = micro batch 2 x dp 2 x 1 accumulation step(s)"  # type: ignore[attr-defined]


def test_a_global_batch_that_does_not_fit_one_sides_layout_is_a_mismatch(dp2: tuple[Experiment, Inventory]) -> None:
    exp, inventory = dp2
    exp = exp.model_copy(update={"gpu": exp.gpu.model_copy(update={"extra_args": ["--global-batch-size", "6"]})})
    report = check_experiment(exp, inventory=inventory)
    assert not report.ok
    fits = _finding(report, "parallel.batch_fits")
    assert fits.status == "mismatch"  # type: ignore[attr-defined]
    assert fits.problems == ("GPU must be True",)  # type: ignore[attr-defined]
    assert fits.gpu.source == "global batch 6 is not a multiple of micro batch 2 x dp 2"  # type: ignore[attr-defined]
