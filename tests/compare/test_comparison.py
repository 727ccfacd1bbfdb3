"""compare(): verdicts, criteria evaluation, coverage, metric sets, resolution flags, performance, JSON shape."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import numpy as np
import pytest

from alignflow.compare.comparison import compare
from alignflow.config.criteria import Criterion, default_criteria
from alignflow.logs import ParsedLog, parse_log
from alignflow.logs.render import megatron_line
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed


def _pair(n: int = 200, *, loss_noise: float = 1e-4, loss_offset: float = 0.0) -> tuple[ParsedLog, ParsedLog]:
    ref_run = make_run(n, seed=11)
    test_run = perturbed(ref_run, loss_noise=loss_noise, grad_noise=1e-3, loss_offset=loss_offset, seed=12)
    return (parse_log(mindformers_lines(test_run), source="npu.log"),
            parse_log(megatron_lines(ref_run), source="gpu.log"))


def test_aligned_runs_pass_every_default_criterion() -> None:
    test, ref = _pair()
    result = compare(test, ref, default_criteria())
    assert result.verdict == "pass"
    assert result.reasons == ()
    assert [r.passed for r in result.criteria] == [True] * 5
    assert result.steps.compared == 200
    assert list(result.metrics) == ["lm_loss", "mtp_1_loss", "load_balancing_loss", "grad_norm", "lr"]


def test_a_loss_offset_fails_the_mean_error_criterion_as_a_verdict() -> None:
    test, ref = _pair(loss_offset=0.002)
    result = compare(test, ref, default_criteria())
    assert result.verdict == "fail"
    me = result.criteria[0]
    assert me.criterion.label == "|me(lm_loss)| < 0.001"
    assert not me.passed
    assert me.value == pytest.approx(0.002, abs=1e-4)
    assert result.criteria[2].passed  # step_rel at step 1 is still tiny relative to a loss of ~11
    assert any(r.startswith("|me(lm_loss)| < 0.001 failed: value +0.00") for r in result.reasons)


def test_a_fatal_sentinel_on_either_side_fails_the_verdict_even_when_curves_agree() -> None:
    ref_run = make_run(50)
    ref_lines = ["load_return: None\n", *megatron_lines(ref_run)]
    result = compare(parse_log(megatron_lines(ref_run)), parse_log(ref_lines), default_criteria())
    assert all(r.passed for r in result.criteria)
    assert result.verdict == "fail"
    assert result.reasons == ("1 fatal sentinel line(s) in the reference log: megatron_nonstrict_load",)
    assert [s.kind for s in result.sentinels["reference"]] == ["megatron_nonstrict_load"]


def test_non_fatal_sentinels_do_not_fail_the_verdict() -> None:
    run = make_run(50)
    lines = ["successfully fixed query-key-values ordering for checkpoint version 0\n", *megatron_lines(run)]
    assert compare(parse_log(lines), parse_log(megatron_lines(run)), default_criteria()).verdict == "pass"


def test_steps_on_one_side_only_are_listed_not_dropped() -> None:
    run = make_run(110)
    test = parse_log(megatron_lines(run)[:100])  # steps 1..100
    ref_lines = megatron_lines(run)
    ref = parse_log(ref_lines[:90] + ref_lines[94:])  # steps 1..90, 95..110
    result = compare(test, ref, default_criteria())
    assert result.steps.compared == 96
    assert result.steps.only_test == (91, 92, 93, 94)
    assert result.steps.only_reference == tuple(range(101, 111))
    aligned = result.aligned
    assert aligned.index.tolist() == list(range(1, 111))
    assert aligned.loc[92, "in_test"]
    assert not aligned.loc[92, "in_reference"]
    assert math.isnan(aligned.loc[92, "lm_loss_reference"])
    assert result.verdict == "pass"


def test_mtp_on_one_side_only_is_reported_and_a_criterion_on_it_fails_with_a_note() -> None:
    run = make_run(60, mtp_depths=1)
    test = parse_log(mindformers_lines(run))
    ref = parse_log(megatron_lines(run, mtp=False))
    rule = Criterion(metric="mtp_1_loss", statistic="mean_rel", threshold=0.01)
    result = compare(test, ref, [*default_criteria(), rule])
    assert result.metrics_only_test == ("mtp_1_loss",)
    assert result.metrics_only_reference == ()
    assert "mtp_1_loss" not in result.metrics
    mtp = result.criteria[-1]
    assert not mtp.passed
    assert math.isnan(mtp.value)
    assert mtp.note.startswith("mtp_1_loss is not in the reference log")
    assert "mtp_1_loss_test" in result.aligned.columns
    assert result.verdict == "fail"


def test_threshold_finer_than_the_printed_resolution_is_flagged() -> None:
    test, ref = _pair()  # reference grad norm printed with 3 decimals
    tight = Criterion(metric="grad_norm", statistic="me", threshold=1e-4)
    ok = Criterion(metric="grad_norm", statistic="me", threshold=0.01)
    tight_rel = Criterion(metric="lm_loss", statistic="step_rel", threshold=1e-8, steps=[1])
    result = compare(test, ref, [tight, ok, tight_rel])
    assert result.criteria[0].below_resolution
    assert "the reference log prints grad_norm with 3 decimals" in result.criteria[0].note
    assert not result.criteria[1].below_resolution
    assert result.criteria[1].note == ""
    assert result.criteria[2].below_resolution
    assert "relative" in result.criteria[2].note
    assert result.metrics["grad_norm"].resolution == pytest.approx(1e-3)


def test_step_rel_at_a_step_only_one_log_printed_fails_and_one_neither_printed_is_not_evaluated() -> None:
    test, ref = _pair(50)
    short = parse_log(megatron_lines(make_run(40, seed=11)), source="gpu.log")
    rule = Criterion(metric="lm_loss", statistic="step_rel", threshold=0.005, steps=[1, 45, 500])
    (result,) = compare(test, short, [rule]).criteria
    assert result.evaluated
    assert not result.passed
    assert "step 45 not compared" in result.note
    assert "step 500 not printed by either log: not evaluated there" in result.note
    (result,) = compare(test, ref, [rule.model_copy(update={"steps": [1, 500]})]).criteria
    assert result.passed
    assert result.steps_used == (1,)


def test_no_criteria_and_no_common_steps_cannot_pass() -> None:
    test, ref = _pair(20)
    assert compare(test, ref, []).reasons == ("no criteria given: nothing can pass",)
    late = parse_log(megatron_lines(make_run(5, start=100)))
    result = compare(test, late, default_criteria())
    assert result.verdict == "fail"
    assert "no step is in both logs" in result.reasons
    assert all(not r.passed for r in result.criteria)


def test_signed_and_inclusive_criteria() -> None:
    test, ref = _pair(loss_offset=0.002)
    signed = Criterion(metric="lm_loss", statistic="me", threshold=0.001, absolute=False)
    results = compare(ref, test, [signed]).criteria  # reversed sides: the mean error is about -0.002
    assert results[0].passed  # -0.002 < 0.001 when the sign is kept
    half = [megatron_line(s, 3, consumed_samples=s, elapsed_ms=1.0, lr=1e-4, global_batch_size=1,
                          losses={"lm loss": 2.5}, grad_norm=1.0) for s in (1, 2, 3)]
    two = [megatron_line(s, 3, consumed_samples=s, elapsed_ms=1.0, lr=1e-4, global_batch_size=1,
                         losses={"lm loss": 2.0}, grad_norm=1.0) for s in (1, 2, 3)]
    at = Criterion(metric="lm_loss", statistic="max_abs", threshold=0.5)
    at_inclusive = Criterion(metric="lm_loss", statistic="max_abs", threshold=0.5, inclusive=True)
    exclusive, inclusive = compare(parse_log(half), parse_log(two), [at, at_inclusive]).criteria
    assert exclusive.value == 0.5
    assert not exclusive.passed
    assert inclusive.passed


def test_performance_figures_after_warm_up_match_an_independent_computation() -> None:
    ref_run = make_run(120, seed=5, step_time_ms=700.0)
    test_run = perturbed(ref_run, time_scale=0.8)
    result = compare(parse_log(megatron_lines(test_run)), parse_log(megatron_lines(ref_run)), [],
                     perf_warmup_steps=10)
    perf = result.performance
    assert perf.test is not None
    assert perf.reference is not None
    ref_times = [float(f"{t:.1f}") for t in ref_run.step_time_ms][10:]
    assert perf.reference.steps == 110
    assert perf.reference.ms_per_iter_mean == pytest.approx(statistics.fmean(ref_times))
    q = statistics.quantiles(ref_times, n=100, method="inclusive")
    assert perf.reference.ms_per_iter_p95 == pytest.approx(q[94])
    assert perf.reference.ms_per_iter_p99 == pytest.approx(q[98])
    assert perf.reference.samples_per_s == pytest.approx(8 * 1000 / statistics.fmean(ref_times))
    test_times = [float(f"{t:.1f}") for t in test_run.step_time_ms][10:]
    expected_change = (8000 / statistics.fmean(test_times)) / (8000 / statistics.fmean(ref_times)) - 1
    assert perf.throughput_change == pytest.approx(expected_change)
    assert perf.throughput_change == pytest.approx(0.25, abs=0.01)


def test_json_document_has_the_issue_shape_and_is_strict_json() -> None:
    test, ref = _pair(30)
    doc = compare(test, ref, default_criteria()).to_json()
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text) == doc
    assert doc["verdict"] in ("pass", "fail")
    for item in doc["criteria"]:
        assert {"metric", "statistic", "value", "threshold", "passed"} <= set(item)
    for stats in doc["metrics"].values():
        assert {"me", "mean_abs", "max_error", "min_error", "max_abs", "mean_rel", "max_rel", "step_rel"} <= set(stats)
    assert set(doc["metrics"]["lm_loss"]["step_rel"]) == {"1"}
    assert {"compared", "only_test", "only_reference"} <= set(doc["steps"])
    assert set(doc["sentinels"]) == {"test", "reference"}
    assert doc["metrics"]["lm_loss"]["perplexity"]["test"] > 1


def test_aligned_error_columns_are_test_minus_reference() -> None:
    test, ref = _pair(40)
    aligned = compare(test, ref, []).aligned
    expected = test.frame["lm_loss"] - ref.frame["lm_loss"]
    assert np.allclose(aligned["lm_loss_error"], expected.reindex(aligned.index), rtol=0, atol=0)
    rel = np.abs(expected) / (np.abs(ref.frame["lm_loss"]) + 1e-8)
    assert np.allclose(aligned["lm_loss_rel_error"], rel.reindex(aligned.index), rtol=0, atol=0)


def test_negative_tolerances_are_refused() -> None:
    test, ref = _pair(5)
    with pytest.raises(ValueError, match=r"must be >= 0"):
        compare(test, ref, [], lr_step_tolerance=-1)


def _first_step_drop(n: int = 20) -> tuple[list[str], list[str]]:
    """A correct run whose loss drops 1.0 from step 1 to step 2: NPU lines, and Megatron >= 0.16 lines (which
    print step 2 as the mean of steps 1 and 2)."""
    run = make_run(n, seed=41)
    run = replace(run, lm_loss=[run.lm_loss[0] + 1.0, *run.lm_loss[1:]])
    return mindformers_lines(perturbed(run, loss_noise=1e-4, seed=42)), megatron_lines(run)


def test_megatron_first_interval_averaging_is_undone_before_the_mean_error_is_judged() -> None:
    npu, gpu = _first_step_drop()
    test = parse_log(npu, source="npu.log")
    raw = compare(test, parse_log(gpu, source="gpu.log", first_interval="raw"), default_criteria())
    assert raw.verdict == "fail"  # the printed average at step 2 alone moves ME by ~-0.5 / 20
    assert raw.criteria[0].value == pytest.approx(-0.53 / 20, abs=2e-3)  # (v2 - v1) / 2 over 20 steps
    result = compare(test, parse_log(gpu, source="gpu.log"), default_criteria())
    assert result.verdict == "pass", result.reasons
    assert abs(result.criteria[0].value) < 1e-4
    assert "reference step 2 de-averaged from Megatron's first interval (rounding error up to 3x the printed one)" \
        in result.metrics["lm_loss"].resolution_text
    assert "de-averaged" not in result.metrics["grad_norm"].resolution_text
    at_two = Criterion(metric="lm_loss", statistic="step_rel", threshold=0.01, steps=[2])
    (judged,) = compare(test, parse_log(gpu), [at_two]).criteria
    assert "reference step 2 de-averaged" in judged.note
    inputs = result.to_json()["inputs"]
    assert inputs["test"]["first_interval"] is None
    assert inputs["reference"]["first_interval"]["corrected_steps"] == [2]
    assert inputs["reference"]["first_interval"]["intervals"][0]["columns"] == [
        "lm_loss", "load_balancing_loss", "mtp_1_loss"]
