"""The curve level (issue 21, item 1): the first step where the error leaves its band, the steps driving a failed
criterion, and the numbers' one notation (issue 20)."""

from __future__ import annotations

import numpy as np
import pytest

from alignflow.compare.comparison import compare
from alignflow.compare.divergence import band, divergence, drivers
from alignflow.compare.formatting import criterion_label, fmt_stat, fmt_value
from alignflow.compare.statistics import Pairs
from alignflow.config.criteria import Criterion, default_criteria
from alignflow.logs import parse_log
from alignflow.logs.schema import Resolution
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed

SIX = Resolution("decimals", 6)
THREE = Resolution("decimals", 3)


def _pairs(error: np.ndarray, reference: float = 5.0) -> Pairs:
    steps = np.arange(1, len(error) + 1, dtype=np.int64)
    ref = np.full(len(error), reference)
    return Pairs(steps, ref + error, ref)


def test_the_first_step_outside_the_threshold_band_is_found() -> None:
    error = np.zeros(100)
    error[40:] = 0.002  # from step 41 on, above |me| < 0.001 as a per-step bound
    c = Criterion(metric="lm_loss", statistic="me", threshold=0.001)
    p = _pairs(error)
    d = divergence("lm_loss", p, band("lm_loss", p, [c], SIX, SIX))
    assert (d.first_step, d.steps_outside, d.criterion) == (41, 60, "|me(lm_loss)| < 0.001")
    assert d.band_at_first == pytest.approx(0.001)


def test_the_printed_resolution_and_the_noise_floor_widen_the_band() -> None:
    error = np.full(50, 0.0008)
    error[20] = 0.004
    c = Criterion(metric="grad_norm", statistic="me", threshold=0.0005)
    p = _pairs(error)
    assert divergence("grad_norm", p, band("grad_norm", p, [c], SIX, SIX)).first_step == 1
    # Megatron prints grad norm with 3 decimals: 0.0008 is inside one printed unit, 0.004 is not
    assert divergence("grad_norm", p, band("grad_norm", p, [c], SIX, THREE)).first_step == 21
    noisy = band("grad_norm", p, [c], SIX, THREE, noise_floor=0.005)
    assert divergence("grad_norm", p, noisy, 0.005).first_step is None


def test_a_relative_criterion_bounds_the_error_by_the_reference_and_step_rel_only_its_steps() -> None:
    error = np.full(10, 0.03)  # 0.6% of 5.0
    p = _pairs(error)
    mean_rel = Criterion(metric="lm_loss", statistic="mean_rel", threshold=0.01, exclude_steps=[1, 2])
    assert divergence("lm_loss", p, band("lm_loss", p, [mean_rel], SIX, SIX)).first_step is None
    step_rel = Criterion(metric="lm_loss", statistic="step_rel", threshold=0.005, steps=[3])
    assert divergence("lm_loss", p, band("lm_loss", p, [step_rel], SIX, SIX)).first_step == 3


def test_the_steps_driving_a_mean_error_are_the_ones_pushing_it_and_are_named_in_the_reason() -> None:
    ref_run = make_run(120, seed=5)
    test_run = perturbed(ref_run, loss_noise=1e-5, seed=6)
    for s in (57, 58, 90):  # three bad steps in an otherwise aligned run
        test_run.lm_loss[s - 1] += 0.05
    result = compare(parse_log(mindformers_lines(test_run), source="npu.log"),
                     parse_log(megatron_lines(ref_run), source="gpu.log"), default_criteria())
    me = result.criteria[0]
    assert not me.passed
    assert sorted(d.step for d in me.drivers[:3]) == [57, 58, 90]
    assert me.first_outside == 57
    assert result.metrics["lm_loss"].divergence is not None
    assert result.metrics["lm_loss"].divergence.first_step == 57
    reason = next(r for r in result.reasons if r.startswith("|me(lm_loss)|"))
    named = reason.split("driven by steps ", 1)[1].split(" (", 1)[0].split(", ")
    assert sorted(named[:3]) == ["57", "58", "90"]
    assert "first outside its band at step 57" in reason


def test_drivers_of_an_extreme_are_the_extreme_steps() -> None:
    error = np.zeros(20)
    error[[4, 11]] = [0.2, -0.3]
    p = _pairs(error)
    c = Criterion(metric="lm_loss", statistic="max_abs", threshold=0.1)
    assert [d.step for d in drivers(c, p, 0.3)] == [12, 5]
    low = Criterion(metric="lm_loss", statistic="min_error", threshold=0.1)
    assert [d.step for d in drivers(low, p, -0.3)] == [12]


@pytest.mark.parametrize(("value", "statistic", "quantum", "text"), [
    (-2.48e-05, "me", 1e-6, "-2.48e-05"),
    (-1e-9, "me", 1e-3, "-1e-09"),
    (0.0, "me", 1e-3, "0"),
    (0.0030041, "me", 1e-6, "+0.003004"),
    (0.5, "max_abs", None, "0.5000"),
    (4e-7, "step_rel", 1e-6, "0.00004%"),  # magnitude 5: one printed unit is 0.00002%
    (0.0123, "mean_rel", 1e-6, "1.230000%"),
    # far below the resolution (one unit 0.00002%): float noise keeps its magnitude, not three digits
    (2.2e-16, "max_rel", 1e-6, "2e-14%"),
    (2.75e-17, "mean_rel", 1e-6, "3e-15%"),
    (2.2e-16, "max_rel", None, "2.20e-14%"),  # resolution unknown: three significant digits
])
def test_one_notation_relative_in_percent_small_absolute_in_scientific(value: float, statistic: str,
                                                                       quantum: float | None, text: str) -> None:
    assert fmt_stat(value, statistic, quantum, magnitude=5.0) == text


def test_no_number_is_ever_minus_zero() -> None:
    for value in (-1e-12, -4e-5, -0.00004, -0.0004999):
        for quantum in (None, 1e-3, 1e-4, 1.0):
            text = fmt_value(value, quantum, signed=True)
            assert any(c in "123456789" for c in text.split("e")[0]), (value, quantum, text)


def test_a_relative_criterion_reads_in_percent() -> None:
    assert criterion_label(Criterion(metric="lm_loss", statistic="step_rel", threshold="0.5%")) == \
        "|step_rel(lm_loss, step 1)| < 0.5%"
    assert criterion_label(Criterion(metric="grad_norm", statistic="me", threshold=0.01)) == "|me(grad_norm)| < 0.01"
