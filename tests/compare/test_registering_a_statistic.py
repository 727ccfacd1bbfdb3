"""A new statistic is one registry entry: registered here, in the test, a criteria file may name it, the comparison
computes and judges it, a failed one names the steps that drive it and where it leaves its band, and the tables, the
JSON record and the noise floor carry it - no product file names it (docs/architecture.md#where-code-goes)."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from alignflow.compare.comparison import compare
from alignflow.compare.report import report_json
from alignflow.compare.tables import criteria_table, metric_cells, metric_header, metrics_table
from alignflow.config import statistics
from alignflow.config.criteria import Criterion
from alignflow.config.statistics import Errors, Statistic
from alignflow.diagnose.noise import noise_floor
from alignflow.logs import parse_log
from tests.logfixtures import make_run, megatron_lines, perturbed


def _squared(e: Errors) -> statistics.FloatArray:
    return e.error ** 2


MEAN_SQ = Statistic("mean_sq", "mean e²", _squared, "mean", description="mean squared error")


@pytest.fixture(autouse=True)
def _mean_sq(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(statistics.STATISTICS, MEAN_SQ.name, MEAN_SQ)  # the one registry entry


def test_a_registered_statistic_is_computed_judged_and_shown() -> None:
    ref_run = make_run(40, seed=3)
    test_run = perturbed(ref_run, loss_noise=2e-3, grad_noise=5e-3, seed=4)
    test, ref = parse_log(megatron_lines(test_run)), parse_log(megatron_lines(ref_run))
    tight = Criterion(metric="lm_loss", statistic="mean_sq", threshold=1e-9)
    result = compare(test, ref, [tight, Criterion(metric="lm_loss", statistic="mean_sq", threshold=1.0)])
    err = (test.frame["lm_loss"] - ref.frame["lm_loss"]).dropna()
    (failed, passed) = result.criteria
    assert failed.value == pytest.approx(float((err ** 2).mean()), rel=1e-12)
    assert (failed.status, passed.status) == ("fail", "pass")
    assert failed.drivers  # the steps whose squared errors add most to the mean
    assert failed.drivers[0].step == int((err ** 2).idxmax())
    assert failed.first_outside is not None  # its threshold as a per-step band
    doc = result.metrics["lm_loss"].to_json()
    assert doc["mean_sq"] == pytest.approx(failed.value)
    assert "mean e²" in metric_header()
    assert len(metric_cells("lm_loss", doc)) == len(metric_header())
    assert len(metrics_table([result], ["test", "ref"]).rows[0]) == len(metric_header())
    assert "mean_sq(lm_loss)" in criteria_table([result], ["test", "ref"]).rows[0][0]
    assert report_json([result], ["test", "ref"])["criteria"][0]["statistic"] == "mean_sq"
    floor = noise_floor("exp", [ref, test])
    assert math.isfinite(floor.statistics["lm_loss"]["mean_sq"])


def test_an_unregistered_statistic_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ValidationError, match=r"unknown statistic 'mean_cube'; registered: .*mean_sq"):
        Criterion(metric="lm_loss", statistic="mean_cube", threshold=1.0)
