"""Megatron's first printed interval: megatron-core >= 0.16 averages a process's first iteration into its next line.

The logs are written by `tests.logfixtures.training_log`, which applies `training_log`'s accumulator rules to known
per-iteration losses and prints them with Megatron's own format strings; the parser must give back the
per-iteration values within the printed resolution, and never a value it cannot justify.
"""

from __future__ import annotations

import math

import pytest

from alignflow.errors import LogParseError
from alignflow.logs import ParsedLog, Resolution, parse_log
from tests.logfixtures import BANNER, training_log

E6 = Resolution("significant", 6)  # `{:.6E}`


def iterations(n: int, *, keys: tuple[str, ...] = ("lm loss", "load_balancing_loss", "z_loss", "mtp_1 loss",
                                                   "mtp_2 loss")) -> list[dict[str, float]]:
    """Per-iteration losses with a large step-1 -> step-2 drop, as after a real first optimizer step."""
    out = []
    for i in range(n):
        lm = 11.0 - 0.8 * min(i, 1) - 0.05 * i + 0.003 * (i % 3)
        extra = {"load_balancing_loss": 1.0 + 0.01 * i, "z_loss": 1.9 + 0.02 * (i % 4),
                 "mtp_1 loss": lm + 0.3, "mtp_2 loss": lm + 0.45}
        out.append({k: lm if k == "lm loss" else extra[k] for k in keys})
    return out


def column(key: str) -> str:
    return {"lm loss": "lm_loss", "mtp_1 loss": "mtp_1_loss", "mtp_2 loss": "mtp_2_loss"}.get(key, key)


def printed(value: float) -> float:
    return float(f"{value:.6E}")


def assert_recovered(parsed: ParsedLog, step: int, true: dict[str, float], factor: float) -> None:
    """Each column at `step` is the true value to within `factor` x the printed half-unit."""
    for key, value in true.items():
        got = float(parsed.frame.loc[step, column(key)])
        bound = factor * E6.quantum(value) / 2 * (1 + 1e-9)
        assert abs(got - value) <= bound, (step, key, got, value, bound)


def test_golden_016_log_step_two_is_recovered_within_the_printed_resolution() -> None:
    its = iterations(6)
    lines = training_log(its)
    # the golden line: iteration 2 prints the mean of iterations 1 and 2, with Megatron's format strings
    assert lines[3] == (
        " [2026-08-20 10:15:04.118000] iteration        2/       6 | consumed samples:            8 | elapsed time "
        "per iteration (ms): 500.0 | learning rate: 3.333333E-05 | global batch size:     4 | lm loss: 1.057650E+01 | "
        "load_balancing_loss: 1.005000E+00 | z_loss: 1.910000E+00 | mtp_1 loss: 1.087650E+01 | mtp_2 loss: "
        "1.102650E+01 | loss scale: 1.0 | grad norm: 1.002 | number of skipped iterations:   0 | number of nan "
        "iterations:   0 |\n")
    parsed = parse_log(lines, source="gpu.log")
    assert parsed.steps == [1, 2, 3, 4, 5, 6]
    assert_recovered(parsed, 2, its[1], factor=3)
    assert abs(parsed.frame.loc[2, "lm_loss"] - its[1]["lm loss"]) < 1e-5  # 2 * 10.5765 - 11.0 = 10.153
    for step in (1, 3, 4, 5, 6):  # every other line is its own iteration's, kept exactly as printed
        for key, value in its[step - 1].items():
            assert parsed.frame.loc[step, column(key)] == printed(value), (step, key)
    assert parsed.frame["grad_norm"].tolist() == [round(1.0 + s / 1000, 3) for s in range(1, 7)]  # last-iteration
    note = parsed.first_interval
    assert note is not None
    assert note.mode == "auto"
    assert note.corrected_steps == (2,)
    (interval,) = note.intervals
    assert (interval.first_step, interval.first_line, interval.step, interval.line) == (1, 3, 2, 4)
    assert set(interval.columns) == {"lm_loss", "load_balancing_loss", "z_loss", "mtp_1_loss", "mtp_2_loss"}
    assert interval.error_factor == 3
    assert "microsecond timestamps" in interval.reason
    assert parsed.sentinels == ()
    assert "de-averaged step(s): 2" in parsed.summary()


def test_raw_keeps_the_printed_average_and_says_what_it_is() -> None:
    its = iterations(4)
    parsed = parse_log(training_log(its), first_interval="raw")
    assert parsed.frame.loc[2, "lm_loss"] == printed((its[0]["lm loss"] + its[1]["lm loss"]) / 2)
    assert abs(parsed.frame.loc[2, "lm_loss"] - its[1]["lm loss"]) > 0.3  # the averaging the correction undoes
    note = parsed.first_interval
    assert note is not None
    assert note.corrected_steps == ()
    assert "step 2 is the mean of iterations 1..2" in note.describe()


def test_old_format_with_seconds_only_timestamps_is_left_as_printed() -> None:
    its = iterations(6)
    parsed = parse_log(training_log(its, core_016=False))  # 0.8-0.15: every line its own iteration's
    for step in range(1, 7):
        assert parsed.frame.loc[step, "lm_loss"] == printed(its[step - 1]["lm loss"])
    note = parsed.first_interval
    assert note is not None
    assert note.corrected_steps == ()
    assert "seconds-only timestamps" in note.intervals[0].reason
    # and with --log-interval 5 the first printed line is iteration 5, an ordinary interval
    parsed = parse_log(training_log(its * 2, core_016=False, log_interval=5))
    assert parsed.steps == [5, 10]
    assert parsed.frame.loc[5, "lm_loss"] == printed(sum(i["lm loss"] for i in its[:5]) / 5)


@pytest.mark.parametrize("timestamp", [True, False])
def test_interval_greater_than_one_recovers_the_mean_over_the_rest_of_the_first_interval(timestamp: bool) -> None:
    its = iterations(16)
    parsed = parse_log(training_log(its, log_interval=5, timestamp=timestamp))
    assert parsed.steps == [1, 5, 10, 15]
    mean_2_5 = {k: sum(i[k] for i in its[1:5]) / 4 for k in its[0]}
    assert_recovered(parsed, 5, mean_2_5, factor=(5 + 1) / (5 - 1))
    assert parsed.frame.loc[10, "lm_loss"] == printed(sum(i["lm loss"] for i in its[5:10]) / 5)
    note = parsed.first_interval
    assert note is not None
    assert note.corrected_steps == (5,)
    assert note.intervals[0].error_factor == 1.5
    # without a timestamp the evidence is that iteration 1 was printed off the --log-interval grid
    assert ("microsecond" if timestamp else "off the --log-interval 5 grid") in note.intervals[0].reason


def test_no_timestamp_with_interval_one_is_undecidable_unless_deaverage_is_asked() -> None:
    its = iterations(5)
    lines = training_log(its, timestamp=False, banner=False)  # as the Megatron-Bridge docs show lines
    auto = parse_log(lines)
    assert auto.frame.loc[2, "lm_loss"] == printed((its[0]["lm loss"] + its[1]["lm loss"]) / 2)
    assert auto.first_interval is not None
    assert "no timestamp" in auto.first_interval.intervals[0].reason
    assert auto.sentinels == ()
    forced = parse_log(lines, first_interval="deaverage")
    assert_recovered(forced, 2, its[1], factor=3)
    assert forced.first_interval is not None
    assert forced.first_interval.intervals[0].reason == "first_interval=deaverage"


def test_deaverage_also_applies_to_a_seconds_only_log_when_asked() -> None:
    its = iterations(3)
    lines = training_log(its)
    seconds = [line.replace(".118000]", "]") for line in lines]  # a 0.16+ log whose timestamps lost microseconds
    assert parse_log(seconds).first_interval.corrected_steps == ()  # type: ignore[union-attr]
    assert_recovered(parse_log(seconds, first_interval="deaverage"), 2, its[1], factor=3)


def test_skipped_first_iteration_is_not_in_the_average_and_its_counters_are_not_counted_twice() -> None:
    its = iterations(4)
    its[0] = {k: math.nan for k in its[0]}  # iteration 1 overflowed: skipped, its loss never summed
    parsed = parse_log(training_log(its, skipped={1}))
    f = parsed.frame
    assert math.isnan(f.loc[1, "lm_loss"])  # Megatron printed no loss on iteration 1's line
    assert f.loc[2, "lm_loss"] == printed(its[1]["lm loss"])  # already iteration 2's own: kept
    assert f.loc[1, "skipped"] == 1
    assert f.loc[2, "skipped"] == 0  # the line printed 1: iteration 1 counted again
    assert f.loc[2, "nan_iterations"] == 0
    note = parsed.first_interval
    assert note is not None
    (interval,) = note.intervals
    assert interval.corrected
    assert interval.columns == ("skipped", "nan_iterations")
    assert "iteration 1 was skipped" in interval.reason
    # the nan counter is reported once, on iteration 1's line, not again on iteration 2's
    assert [(s.line_no, s.kind) for s in parsed.sentinels] == [(3, "nan_iterations"), (3, "skipped_iterations")]


def test_nan_loss_at_iteration_one_is_never_invented() -> None:
    its = iterations(4)
    its[0]["lm loss"] = math.nan  # not skipped (no loss scaling): the NaN stays in the sum until the next reset
    parsed = parse_log(training_log(its))
    f = parsed.frame
    assert math.isnan(f.loc[1, "lm_loss"])
    assert math.isnan(f.loc[2, "lm_loss"])  # Megatron printed no lm loss on either line: none is made up
    assert f.loc[3, "lm_loss"] == printed(its[2]["lm loss"])
    assert_recovered(parsed, 2, {k: v for k, v in its[1].items() if k != "lm loss"}, factor=3)


def test_a_loss_missing_from_the_first_line_is_left_averaged_with_a_warning() -> None:
    its = iterations(3)
    lines = training_log(its)
    lines[2] = lines[2].replace(" z_loss: 1.900000E+00 |", "")  # iteration 1 printed no z_loss
    parsed = parse_log(lines)
    assert parsed.frame.loc[2, "z_loss"] == printed((its[0]["z_loss"] + its[1]["z_loss"]) / 2)
    assert_recovered(parsed, 2, {k: v for k, v in its[1].items() if k != "z_loss"}, factor=3)
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert interval.kept == ("z_loss",)
    (warning,) = parsed.sentinels
    assert (warning.line_no, warning.kind, warning.fatal) == (4, "first_interval_averaged", False)
    assert "z_loss at step 2 may be the mean of iterations 1..2" in warning.message


def test_missing_first_line_after_the_training_start_is_reported_not_guessed() -> None:
    its = iterations(5)
    lines = training_log(its)
    del lines[2]  # iteration 1's line is gone; the log still shows where training started
    parsed = parse_log(lines)
    assert parsed.frame.loc[2, "lm_loss"] == printed((its[0]["lm loss"] + its[1]["lm loss"]) / 2)  # as printed
    assert parsed.frame.loc[3, "lm_loss"] == printed(its[2]["lm loss"])
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert (interval.first_step, interval.first_line, interval.step, interval.corrected) == (1, None, 2, False)
    assert "iteration 1, the process's first, has no line" in interval.reason
    assert [(s.line_no, s.kind) for s in parsed.sentinels] == [(3, "first_interval_averaged")]


def test_a_log_starting_later_without_a_training_start_line_may_be_a_tail_and_is_left_as_printed() -> None:
    its = iterations(5)
    lines = training_log(its, banner=False)[1:]  # starts at step 2: iteration 1's line, or the log's head, lost
    parsed = parse_log(lines)
    assert parsed.frame.loc[2, "lm_loss"] == printed((its[0]["lm loss"] + its[1]["lm loss"]) / 2)
    assert parsed.frame.loc[3, "lm_loss"] == printed(its[2]["lm loss"])
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert not interval.corrected
    assert "cannot tell whether step 2 was its process's first printed iteration" in interval.reason
    assert parsed.sentinels == ()


def test_an_unreadable_first_line_is_reported_not_guessed() -> None:
    its = iterations(5)
    lines = training_log(its)
    lines[2] = lines[2][:120] + "\n"  # iteration 1's line cut mid-field, before its losses
    parsed = parse_log(lines)
    assert parsed.frame.loc[2, "lm_loss"] == printed((its[0]["lm loss"] + its[1]["lm loss"]) / 2)
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert "step 1's line was read only in part (line 3 ends inside a field)" in interval.reason
    # its complete fields are read (issue 33), a warning says what was not; no loss is guessed
    assert parsed.frame.loc[1, "consumed_samples"] == 4
    assert {(s.line_no, s.kind, s.fatal) for s in parsed.sentinels} == {(3, "partial_step_line", False),
                                                                         (4, "first_interval_averaged", False)}


def test_a_first_line_with_no_field_at_all_is_reported_not_guessed() -> None:
    its = iterations(5)
    lines = training_log(its)
    lines[2] = lines[2][:lines[2].index("|") + 4] + "\n"  # iteration 1's line cut inside its first field
    parsed = parse_log(lines)
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert "has an unreadable line" in interval.reason
    assert {(s.line_no, s.kind) for s in parsed.sentinels} == {(3, "malformed_step_line"),
                                                               (4, "first_interval_averaged")}


def test_a_missing_line_inside_the_first_interval_leaves_the_next_line_alone() -> None:
    its = iterations(6)
    lines = training_log(its)
    del lines[3]  # iteration 2's line (the averaged one) is gone: iteration 3's line is an ordinary interval
    parsed = parse_log(lines)
    assert parsed.steps == [1, 3, 4, 5, 6]
    assert parsed.frame.loc[3, "lm_loss"] == printed(its[2]["lm loss"])
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert not interval.corrected
    assert "next printed iteration was 2, not 3" in interval.reason


def test_a_restart_that_repeats_steps_is_corrected_per_process() -> None:
    first, resumed = iterations(6), [{k: v - 0.01 for k, v in d.items()} for d in iterations(8)[3:]]
    for banner in (True, False):  # with the restart's startup lines, or only the step counter going back
        lines = training_log(first, train_iters=8, banner=banner) + training_log(resumed, start=3, banner=banner)
        parsed = parse_log(lines)
        assert parsed.steps == list(range(1, 9))
        assert parsed.repeated_steps == (4, 5, 6)
        assert_recovered(parsed, 2, first[1], factor=3)
        assert parsed.frame.loc[4, "lm_loss"] == printed(resumed[0]["lm loss"])  # the resumed process's first
        assert_recovered(parsed, 5, resumed[1], factor=3)  # the resumed process's own first interval
        for step in (6, 7, 8):
            assert parsed.frame.loc[step, "lm_loss"] == printed(resumed[step - 4]["lm loss"])
        note = parsed.first_interval
        assert note is not None
        assert note.corrected_steps == (2, 5)
        assert [i.first_step for i in note.intervals] == [1, 4]
        (restart,) = parsed.sentinels  # the resume is said (issue 33), as a warning
        assert (restart.kind, restart.fatal) == ("restart", False)
        assert "goes back from 6 to 4" in restart.message


def test_a_resumed_process_whose_first_line_is_missing_keeps_its_average_with_a_warning() -> None:
    first, resumed = iterations(6), iterations(8)[3:]
    tail = training_log(resumed, start=3)
    del tail[3]  # after the load line and the two startup lines: iteration 4's line
    parsed = parse_log(training_log(first, train_iters=8) + tail)
    assert parsed.frame.loc[5, "lm_loss"] == printed((resumed[0]["lm loss"] + resumed[1]["lm loss"]) / 2)
    note = parsed.first_interval
    assert note is not None
    assert note.corrected_steps == (2,)
    assert "iteration 4, the process's first, has no line" in note.intervals[1].reason
    assert [s.kind for s in parsed.sentinels] == ["restart", "first_interval_averaged"]


def test_every_iteration_after_the_first_skipped_leaves_the_line_as_printed() -> None:
    its = iterations(4)
    parsed = parse_log(training_log(its, skipped={2}))
    assert parsed.frame.loc[2, "lm_loss"] == printed(its[0]["lm loss"])  # Megatron repeats iteration 1's mean
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert not interval.corrected
    assert "no iteration after 1 advanced" in interval.reason
    assert [s.kind for s in parsed.sentinels] == ["skipped_iterations", "first_interval_averaged"]


def test_multi_rank_log_finds_the_training_start_on_rank_zero() -> None:
    its = iterations(4)
    lines = [f"[default0]:{line}" for line in BANNER]
    lines += [f"[default3]:{line}" for line in training_log(its, banner=False)[1:]]  # starts at step 2 on rank 3
    parsed = parse_log(lines)
    assert parsed.rank == 3
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert "iteration 1, the process's first, has no line" in interval.reason
    lines = [f"[default0]:{line}" for line in BANNER] + [f"[default3]:{line}" for line in training_log(its)[2:]]
    assert_recovered(parse_log(lines), 2, its[1], factor=3)


@pytest.mark.parametrize("late", [1, 2])
def test_rank_zero_start_lines_merged_after_the_last_ranks_first_lines_are_late_not_a_new_process(late: int) -> None:
    # torchrun --tee merges each rank's stream as it is flushed: rank 0's `training ...` can land after rank 1's
    # first iteration lines (seen in CI with the twin's two-rank run); the step counter goes on, so no new process
    its = iterations(5)
    steps = [f"[1]:{line}" for line in training_log(its, banner=False)]
    lines = ["[0]:> building GPT model ...\n", *steps[:late], *(f"[0]:{line}" for line in BANNER), *steps[late:]]
    parsed = parse_log(lines)
    assert parsed.rank == 1
    assert_recovered(parsed, 2, its[1], factor=3)
    assert parsed.frame.loc[3, "lm_loss"] == printed(its[2]["lm loss"])
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert (interval.first_step, interval.step, interval.corrected) == (1, 2, True)
    assert parsed.sentinels == ()
    # resumed from iteration 3: the load line, late too, still names the process's first iteration (4)
    resumed = [f"[1]:{line}" for line in training_log(iterations(7)[3:], start=3, banner=False)]
    load = f"[0]:{training_log(its[:1], start=3)[0]}"
    parsed = parse_log([*resumed[:late], load, *(f"[0]:{line}" for line in BANNER), *resumed[late:]])
    (interval,) = parsed.first_interval.intervals  # type: ignore[union-attr]
    assert (interval.first_step, interval.step, interval.corrected) == (4, 5, True)
    assert parsed.sentinels == ()


def test_mindformers_logs_have_no_first_interval_note_and_bad_choices_are_rejected() -> None:
    from tests.logfixtures import make_run, mindformers_lines

    assert parse_log(mindformers_lines(make_run(3))).first_interval is None
    with pytest.raises(LogParseError, match=r"gpu.log: unknown first_interval 'on'; use auto, deaverage, raw"):
        parse_log(training_log(iterations(2)), source="gpu.log", first_interval="on")  # type: ignore[arg-type]
