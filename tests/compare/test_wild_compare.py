"""Comparison edge cases from logs in the wild (issue 15, item 10, and the compare side of items 5-7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.compare.comparison import compare
from alignflow.config.criteria import Criterion, default_criteria
from alignflow.logs import CHECKPOINT_LOADED, parse_log, parse_log_file

WILD = Path(__file__).resolve().parent.parent / "data" / "logs" / "wild"


def pair(name: str) -> tuple[object, object]:
    return (parse_log_file(WILD / f"compare_{name}_test.log"), parse_log_file(WILD / f"compare_{name}_reference.log"))


def test_one_overlapping_step_with_zero_losses_fails_the_minimum_overlap() -> None:
    test, ref = pair("overlap")
    result = compare(test, ref, default_criteria())  # type: ignore[arg-type]
    assert result.steps.compared == 1
    assert result.steps.min_overlap == 5  # 10, or every step of the shorter log (5)
    assert result.verdict == "fail"
    assert "only 1 step(s) compared; at least 5 needed" in result.reasons[0]
    relaxed = compare(test, ref, default_criteria(), min_overlap=1)  # type: ignore[arg-type]
    assert not any("compared; at least" in r for r in relaxed.reasons)


def test_relative_statistics_against_a_zero_reference_are_not_evaluated_and_say_why() -> None:
    test, ref = pair("overlap")
    result = compare(test, ref, default_criteria(), min_overlap=1)  # type: ignore[arg-type]
    relative = [r for r in result.criteria if r.statistic in ("step_rel", "mean_rel")]
    assert [r.status for r in relative] == ["not evaluated"] * 3
    for r in relative:
        assert "the reference lm_loss is 0 at its printed resolution" in r.note
        assert "1e+05" not in r.note
    assert [r.status for r in result.criteria if r.statistic == "me"] == ["pass", "pass"]
    assert result.verdict == "pass"  # the absolute criteria were evaluated and passed
    assert result.to_json()["criteria"][2]["status"] == "not evaluated"


def test_no_evaluable_criterion_cannot_pass() -> None:
    test, ref = pair("overlap")
    only_rel = [c for c in default_criteria() if c.statistic != "me"]
    result = compare(test, ref, only_rel, min_overlap=1)  # type: ignore[arg-type]
    assert result.verdict == "fail"
    assert result.reasons[0].startswith("no criterion could be evaluated")


def test_default_step_rel_uses_the_first_step_both_logs_print_and_says_so() -> None:
    test, ref = pair("interval100")
    result = compare(test, ref, default_criteria())  # type: ignore[arg-type]
    assert result.verdict == "pass", result.reasons
    step_rel = result.criteria[2]
    assert step_rel.criterion.label == "|step_rel(lm_loss, step 1)| < 0.005"
    assert step_rel.steps_used == (100,)
    assert "evaluated at step 100, the first step both logs print with lm_loss (step 1: neither log)" in step_rel.note
    assert result.to_json()["criteria"][2]["steps"] == [100]


def test_step_rel_at_step_1_printed_by_neither_log_is_not_evaluated_not_failed() -> None:
    test, ref = pair("interval100")
    rules = [Criterion(metric="lm_loss", statistic="step_rel", threshold=0.005, steps=[1]),
             Criterion(metric="lm_loss", statistic="me", threshold=0.001)]
    result = compare(test, ref, rules)  # type: ignore[arg-type]
    assert result.criteria[0].status == "not evaluated"
    assert "step 1 not printed or excluded; the first step both logs print is 100" in result.criteria[0].note
    assert result.verdict == "pass"


def test_a_from_scratch_run_fails_only_when_a_loaded_checkpoint_is_required() -> None:
    test, ref = pair("scratch")
    assert compare(test, ref, default_criteria()).verdict == "pass"  # type: ignore[arg-type]
    required = compare(test, ref, default_criteria(), require=[CHECKPOINT_LOADED])  # type: ignore[arg-type]
    assert required.verdict == "fail"
    assert required.reasons == (
        "1 fatal sentinel line(s) in the test log: megatron_no_checkpoint",
        "the test log never shows checkpoint_loaded (required)",
        "1 fatal sentinel line(s) in the reference log: megatron_no_checkpoint",
        "the reference log never shows checkpoint_loaded (required)",
    )
    assert required.to_json()["require"] == ["checkpoint_loaded"]


def test_skipped_steps_are_left_out_of_every_statistic() -> None:
    skip = parse_log_file(WILD / "mindformers_skip_data.log")
    lines = (WILD / "mindformers_skip_data.log").read_text().splitlines()
    clean = parse_log([line for line in lines if "is_skip" not in line and "consecutive times" not in line])
    result = compare(skip, clean, [Criterion(metric="lm_loss", statistic="max_abs", threshold=1e-9)])
    assert result.verdict == "pass", result.reasons  # step 5 and 6 (loss 0.000 on one side) are not compared
    assert result.steps.excluded == (5, 6)
    assert result.steps.compared == 8
    assert result.steps.min_overlap == 8  # every comparable step of the shorter log
    assert result.metrics["lm_loss"].stats.n == 8
    assert result.metrics["lm_loss"].not_compared == 0
    unexcluded = compare(clean, skip, [Criterion(metric="lm_loss", statistic="max_abs", threshold=1e-9)])
    assert unexcluded.steps.excluded == (5, 6)  # whichever side excludes a step, it is out


def test_a_gap_inside_the_compared_range_is_in_the_coverage() -> None:
    gap = parse_log_file(WILD / "megatron_gap.log")
    lines = (WILD / "megatron_gap.log").read_text().splitlines()
    result = compare(gap, parse_log(lines[:150]), default_criteria())
    assert result.steps.gaps == {}  # the gap starts after step 150: outside the compared range
    result = compare(parse_log(lines[:150] + lines[160:]), gap, default_criteria())
    assert result.steps.gaps == {"test": ((151, 160), (201, 899)), "reference": ((201, 899),)}
    assert result.to_json()["steps"]["gaps"]["test"] == [[151, 160], [201, 899]]
    assert [s.kind for s in result.sentinels["test"] if s.kind == "step_gap"] == ["step_gap"] * 2


@pytest.mark.parametrize("value", [0, -3])
def test_min_overlap_below_one_is_refused(value: int) -> None:
    test, ref = pair("overlap")
    with pytest.raises(ValueError, match="min_overlap"):
        compare(test, ref, default_criteria(), min_overlap=value)  # type: ignore[arg-type]
