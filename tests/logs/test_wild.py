"""Logs as they are in the wild (issue 15, items 1-9): each on a log written with the framework's own format strings.

The logs in tests/data/logs/wild/ were written from the format strings of each framework's source (the README
there names each file's source); the values expected here were read off those lines by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from alignflow.errors import SentinelError
from alignflow.logs import check_sentinels, parse_log, parse_log_file

WILD = Path(__file__).resolve().parent.parent / "data" / "logs" / "wild"


def kinds(parsed: object) -> list[tuple[str, bool]]:
    return [(s.kind, s.fatal) for s in parsed.sentinels if s.kind != "incomplete_run"]  # type: ignore[attr-defined]


def test_item1_ms_swift_text_fields_do_not_crash_and_the_numbers_are_read() -> None:
    parsed = parse_log_file(WILD / "ms_swift_sft.log")
    assert parsed.steps == list(range(1, 21))
    row = parsed.frame.loc[2]
    assert row["lm_loss"] == 1.057016e01
    assert row["grad_norm"] == 1.5
    assert row["lr"] == 2e-06
    assert row["step_time_ms"] == 12345.6
    assert row["memory_gib"] == 61.23
    assert "remaining_time" not in parsed.frame.columns  # `7h 6m 43s` is text: not a column
    assert kinds(parsed) == []


def test_item1_a_text_field_in_any_position_of_a_megatron_line_is_skipped() -> None:
    line = (" [2025-09-05 16:08:26] iteration        3/    2000 | consumed samples:           48 | elapsed time: 37s |"
            " remaining time: 7h 6m 43s | packing info: none | lm loss: 1.035110E+01 | grad norm: 1.000 |"
            " number of skipped iterations:   0 | number of nan iterations:   0 |")
    parsed = parse_log([line])
    assert parsed.frame.loc[3, "lm_loss"] == 1.035110e01
    assert parsed.frame.loc[3, "consumed_samples"] == 48


def test_item2_a_printed_nan_grad_norm_in_megatron_is_a_diverged_run() -> None:
    parsed = parse_log_file(WILD / "megatron_grad_norm_nan.log")
    assert "grad_norm" in parsed.frame.columns
    assert parsed.frame["grad_norm"].isna().all()
    assert kinds(parsed) == [("non_finite_value", True)] * 10
    with pytest.raises(SentinelError, match=r"grad_norm is NaN or inf"):
        check_sentinels(parsed)


def test_item3_a_loss_missing_from_megatron_lines_is_fatal_naming_the_steps() -> None:
    parsed = parse_log_file(WILD / "megatron_loss_missing.log")
    (s,) = [s for s in parsed.sentinels if s.kind == "missing_loss"]
    assert (s.fatal, s.line_no) == (True, 6)
    assert "steps 6-10" in s.message
    assert "iteration        6/      10" in s.text
    assert parsed.frame["nan_iterations"].eq(0).all()  # Megatron's own counter saw nothing


def test_item3_a_log_without_any_loss_is_fatal_too() -> None:
    lines = (WILD / "megatron_loss_missing.log").read_text().splitlines()[5:]
    (s,) = [s for s in parse_log(lines).sentinels if s.kind == "missing_loss"]
    assert s.fatal
    assert "no lm_loss or loss on any step line: steps 6-10" in s.message


def test_item4_mindformers_06_lines_are_read_with_both_logger_prefixes_and_sink_mode() -> None:
    parsed = parse_log_file(WILD / "mindformers_r06_stdout.log")
    assert parsed.variant == "legacy-0.6"
    assert parsed.steps == list(range(1, 11))
    assert parsed.max_steps == 125
    first = parsed.frame.loc[1]
    assert first["lm_loss"] == 10.786  # the first of `loss:[10.786/10.786]`
    assert first["step_time_ms"] == 507844.205  # `time:507844.205 ms`
    assert first["lr"] == 0.0  # `lr:[0.]`
    assert parsed.frame.loc[2, "lr"] == 1e-05
    assert parsed.frame.loc[2, "lm_loss"] == 10.570
    assert ("overflow", False) in kinds(parsed)  # `overflow cond: True` at step 4
    sink = parse_log_file(WILD / "mindformers_r06_sink_info.log")
    assert sink.steps == [100, 200, 300]  # (epoch - 1) * sink_size + step
    assert sink.frame.loc[300, "step_time_ms"] == 143211.812


def test_item4_other_epoch_step_lines_are_not_taken_for_step_lines() -> None:
    # TrainingStateMonitor._to_log: "Epoch:[%3d/%3d], step:[%5d/%5d] %s: %.4f"
    lines = ["2025-06-01 10:00:01,000 - mindformers - INFO - Epoch:[  1/  1], step:[    1/   10] local_norm/w: 0.1234",
             *(WILD / "mindformers_r06_stdout.log").read_text().splitlines()]
    assert parse_log(lines).steps == list(range(1, 11))


def test_item5_skipped_data_steps_are_warnings_left_out_and_the_abort_is_fatal() -> None:
    parsed = parse_log_file(WILD / "mindformers_skip_data.log")
    assert parsed.frame.loc[5, "lm_loss"] == 0.0  # the skipped step prints `loss: 0.000`
    assert parsed.excluded_steps == {5: "mf_skipped_data", 6: "mf_skipped_data"}
    assert all(not s.fatal for s in parsed.sentinels)
    check_sentinels(parsed)
    aborted = parse_log_file(WILD / "mindformers_health_abort.log")
    (fatal,) = aborted.fatal_sentinels
    assert (fatal.kind, fatal.line_no) == ("mf_training_aborted", 7)
    assert fatal.text.startswith("ValueError: Current global norm")


def test_item6_megatron_deepspeed_time_in_seconds_and_deepspeed_skips() -> None:
    parsed = parse_log_file(WILD / "megatron_deepspeed_bloom.log")
    assert parsed.frame["step_time_ms"].tolist() == pytest.approx([21790.0] * 5)  # 21.79 s
    assert parsed.frame.loc[1, "throughput_tflops"] == 149.43
    assert parsed.frame.loc[1, "consumed_tokens"] == 4194304
    assert math.isnan(parsed.frame.loc[3, "lm_loss"])  # all of step 3 skipped: `avg > 0.0` printed no loss
    found = {s.kind: s for s in parsed.sentinels}
    assert found["deepspeed_overflow_skip"].line_no == 3
    assert "grew: 1 (was 0)" in found["deepspeed_skipped_steps"].message
    assert found["skipped_iterations"].exclude_steps == (3,)
    assert "missing_loss" not in found  # the skipped counter explains it
    assert parsed.excluded_steps == {3: "skipped_iterations"}
    check_sentinels(parsed)


def test_item7_a_gap_inside_the_log_is_a_warning_listing_the_missing_steps() -> None:
    parsed = parse_log_file(WILD / "megatron_gap.log")
    assert parsed.gaps == ((201, 899),)
    (s,) = [s for s in parsed.sentinels if s.kind == "step_gap"]
    assert not s.fatal
    assert s.line_no == 201  # the line of step 900
    assert "steps 201-899" in s.message
    assert "699 line(s) missing" in s.message


def test_item7_a_coarser_first_interval_is_no_gap_but_a_missing_printed_interval_is() -> None:
    steps = [1, *range(10, 101, 10)]  # megatron-core >= 0.16 prints iteration 1 before the grid
    lines = (WILD / "megatron_gap.log").read_text().splitlines()
    by_step = {int(line.split("iteration")[1].split("/")[0]): line for line in lines}
    assert parse_log([by_step[s] for s in steps]).gaps == ()
    assert parse_log([by_step[s] for s in steps if s != 50]).gaps == ((41, 59),)


def test_item8_a_damaged_key_is_a_warning_naming_both_names() -> None:
    parsed = parse_log_file(WILD / "megatron_broken_key.log")
    (s,) = [s for s in parsed.sentinels if s.kind == "unknown_field"]
    assert "`g_rad_norm`" in s.message
    assert "resembles `grad_norm`" in s.message
    assert not s.fatal
    assert "grad_norm" not in parsed.frame.columns  # not merged: which one is right is for a person to say


def test_item8_known_families_of_new_keys_are_not_flagged() -> None:
    line = (" iteration        1/       3 | lm loss: 6.993355E+00 | load_balancing_loss: 1.024174E+00 |"
            " seq_load_balancing_loss: 1.022547E+00 | z_loss: 1.894531E+00 | mtp_1 loss: 6.999038E+00 |"
            " mtp_2 loss: 7.001E+00 | grad norm: 2.192 | number of skipped iterations:   0 |"
            " number of nan iterations:   0 |")
    assert kinds(parse_log([line])) == []


def test_item9_nemo2_progress_printer_lines_are_read() -> None:
    parsed = parse_log_file(WILD / "nemo2_progress.log")
    assert parsed.fmt == "nemo"
    assert parsed.steps == list(range(1, 11))  # global_step + 1
    assert parsed.max_steps == 100
    row = parsed.frame.loc[1]
    assert row["lm_loss"] == 10.79  # reduced_train_loss
    assert row["lr"] == 1.5e-05
    assert row["step_time_ms"] == pytest.approx(553.3)  # train_step_timing in s: 0.5533
    assert row["consumed_samples"] == 8
    assert parsed.resolution["lm_loss"].describe() == "4 significant digits"
    assert kinds(parsed) == []


def test_item9_a_nan_nemo_loss_is_fatal() -> None:
    lines = (WILD / "nemo2_progress.log").read_text().splitlines()
    lines[3] = lines[3].replace("reduced_train_loss: 10.14", "reduced_train_loss: nan")
    parsed = parse_log(lines)
    assert np.isnan(parsed.frame.loc[4, "lm_loss"])
    assert kinds(parsed) == [("non_finite_value", True)]
