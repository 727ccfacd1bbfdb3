"""parse_log on whole logs: formats and prefixes, ranks, restarts, truncation, damaged lines, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alignflow.errors import LogParseError
from alignflow.logs import Resolution, parse_log, parse_log_file
from alignflow.logs.render import megatron_line, mindformers_pynative_line
from tests.logfixtures import (
    legacy_lines,
    make_run,
    megatron_lines,
    mindformers_lines,
    printed_mf,
    printed_mg_loss,
    printed_mg_norm,
    recovered_mg_loss,
    write,
)


@pytest.mark.parametrize("prefix", ["stdout", "info", "none"])
@pytest.mark.parametrize("generation", [1, 2, 3])
def test_pynative_generations_and_prefixes_give_the_printed_values(generation: int, prefix: str) -> None:
    run = make_run(40, mtp_depths=2)
    parsed = parse_log(mindformers_lines(run, generation=generation, prefix=prefix), source="npu.log")
    assert parsed.fmt == "mindformers"
    assert parsed.variant == f"pynative-g{generation}"
    assert parsed.steps == run.steps
    assert parsed.frame["lm_loss"].tolist() == printed_mf(run.lm_loss)
    assert parsed.resolution["lm_loss"] == Resolution("decimals", 6)
    if generation >= 2:
        assert parsed.frame["grad_norm"].tolist() == printed_mf(run.grad_norm)
    if generation == 3:
        assert parsed.frame["mtp_2_loss"].tolist() == printed_mf(run.mtp[1])
        assert parsed.frame["consumed_samples"].tolist() == [8 * s for s in run.steps]
        assert list(parsed.frame.columns[:3]) == ["lm_loss", "mtp_1_loss", "mtp_2_loss"]
    assert not parsed.sentinels


@pytest.mark.parametrize(("sink", "separate"), [(True, True), (True, False), (False, True), (False, False)])
def test_legacy_total_loss_and_lm_loss_follow_the_reference_semantics(sink: bool, separate: bool) -> None:
    run = make_run(30)
    parsed = parse_log(legacy_lines(run, steps_per_epoch=12, sink=sink, separate=separate))
    assert parsed.variant == "legacy"
    assert parsed.steps == run.steps  # global step = (epoch - 1) * steps_per_epoch + step
    frame = parsed.frame
    if separate:
        assert frame["lm_loss"].tolist() == printed_mf(run.lm_loss)
        assert (frame["total_loss"] > frame["lm_loss"]).all()
        assert "mtp_loss_scaled_sum" in frame.columns
        assert "mtp_1_loss" not in frame.columns
    else:  # no separate losses: the only loss is taken as the LM loss
        assert frame["lm_loss"].tolist() == frame["total_loss"].tolist()
    expected_norm = [float(np.float32(v)) for v in run.grad_norm]
    assert np.allclose(frame["grad_norm"], expected_norm, rtol=1e-7, atol=0)
    assert parsed.resolution["grad_norm"] == Resolution("significant", 7)


@pytest.mark.parametrize("microseconds", [True, False])
def test_megatron_lines_with_aux_losses_and_mtp_depths(microseconds: bool) -> None:
    run = make_run(25, mtp_depths=2)
    z = [0.5 + i / 100 for i in range(run.n)]
    seq = [1.0 + i / 1000 for i in range(run.n)]
    parsed = parse_log(megatron_lines(run, microseconds=microseconds,
                                      extra_losses={"z_loss": z, "seq_load_balancing_loss": seq}))
    f = parsed.frame
    assert parsed.fmt == "megatron"
    # 0.16+ (microseconds) prints step 2 as the mean of steps 1 and 2; the parser takes it back
    expected = recovered_mg_loss if microseconds else printed_mg_loss
    assert f["lm_loss"].tolist() == expected(run.lm_loss)
    assert f["grad_norm"].tolist() == printed_mg_norm(run.grad_norm)
    assert f["mtp_2_loss"].tolist() == expected(run.mtp[1])
    assert f["z_loss"].tolist() == expected(z)
    assert f["seq_load_balancing_loss"].tolist() == expected(seq)
    assert parsed.first_interval is not None
    assert parsed.first_interval.corrected_steps == ((2,) if microseconds else ())
    assert f["nan_iterations"].tolist() == [0] * run.n
    assert parsed.resolution["grad_norm"] == Resolution("decimals", 3)
    assert parsed.resolution["lm_loss"] == Resolution("significant", 6)


def test_format_is_detected_and_an_explicit_wrong_format_is_refused() -> None:
    lines = megatron_lines(make_run(5))
    assert parse_log(lines).fmt == "megatron"
    assert parse_log(lines, fmt="megatron").fmt == "megatron"
    with pytest.raises(LogParseError, match=r"no mindformers step lines.*it has 5 megatron step line"):
        parse_log(lines, fmt="mindformers", source="gpu.log")


def test_a_log_with_both_frameworks_step_lines_is_refused_under_auto() -> None:
    lines = mindformers_lines(make_run(3)) + megatron_lines(make_run(3))
    with pytest.raises(LogParseError, match=r"both MindFormers \(first at line 1\) and Megatron \(first at line 4\)"):
        parse_log(lines)
    assert parse_log(lines, fmt="megatron").steps == [1, 2, 3]


def test_no_step_lines_is_a_parse_error_naming_the_source() -> None:
    with pytest.raises(LogParseError, match=r"empty.log: no step lines"):
        parse_log(["starting\n", "nothing here\n"], source="empty.log")
    with pytest.raises(LogParseError, match=r"no step lines"):
        parse_log([])


def test_restarted_run_keeps_the_last_occurrence_and_reports_it() -> None:
    first = make_run(30, seed=1)
    resumed = make_run(21, seed=2, start=20)  # the resumed run repeats steps 20..30
    lines = mindformers_lines(first, max_steps=40) + mindformers_lines(resumed, max_steps=40)
    parsed = parse_log(lines)
    assert parsed.steps == list(range(1, 41))
    assert parsed.repeated_steps == tuple(range(20, 31))
    assert [(r.line_no, r.from_step, r.to_step) for r in parsed.restarts] == [(31, 30, 20)]
    assert parsed.frame.loc[25, "lm_loss"] == printed_mf(resumed.lm_loss)[5]
    assert parsed.line_numbers.loc[25] == 31 + 5


def test_multi_rank_tee_log_defaults_to_the_last_stage_and_accepts_a_rank() -> None:
    run = make_run(10)
    lines: list[str] = []
    for i in range(run.n):
        for rank in (0, 1, 2):
            lines.append(f"[default{rank}]:some other output of rank {rank}\n")
        # only the last pipeline stage (rank 3) prints training_log lines in Megatron
        lines += megatron_lines(run, rank_prefix="[default3]:")[i:i + 1]
    lines.insert(5, "[default1]:load_return: None\n")
    parsed = parse_log(lines)
    assert parsed.rank == 3
    assert parsed.ranks == (3,)
    assert parsed.steps == run.steps
    # a failed load on any rank invalidates the run
    assert [(s.kind, s.rank, s.line_no) for s in parsed.sentinels] == [("megatron_nonstrict_load", 1, 6)]
    assert parse_log(lines, rank=3).steps == run.steps
    with pytest.raises(LogParseError, match=r"rank 1 printed no megatron step lines.*ranks with step lines: 3"):
        parse_log(lines, rank=1)


def test_mindformers_pipeline_stages_in_one_stream_pick_the_stage_with_losses() -> None:
    lines = []
    for s in range(1, 6):
        lines.append("[2]:" + mindformers_pynative_line(s, 5, loss=None, step_time_ms=700) + "\n")
        lines.append("[5]:" + mindformers_pynative_line(s, 5, loss=3.0 - s / 10, step_time_ms=700, lr=1e-5,
                                                        grad_norm=1.0) + "\n")
    parsed = parse_log(lines)
    assert parsed.rank == 5
    assert parsed.ranks == (2, 5)
    with pytest.raises(LogParseError, match=r"only `loss: N/A`: not the last pipeline stage"):
        parse_log(lines, rank=2)


def test_rank_requested_for_a_log_without_rank_prefixes_is_refused() -> None:
    with pytest.raises(LogParseError, match=r"carry no rank prefix; pass that rank's own log"):
        parse_log(megatron_lines(make_run(3)), rank=1)


def test_srun_label_prefix_is_a_rank() -> None:
    lines = ["0: " + line for line in megatron_lines(make_run(3))]
    assert parse_log(lines).rank == 0


def test_truncated_last_line_is_ignored_and_reported() -> None:
    lines = megatron_lines(make_run(6))
    lines[-1] = lines[-1][:150] + "\n"  # the process died while writing
    parsed = parse_log(lines)
    assert parsed.steps == [1, 2, 3, 4, 5]
    kinds = {(s.kind, s.fatal, s.line_no) for s in parsed.sentinels}
    assert ("truncated_step_line", False, 6) in kinds
    assert ("incomplete_run", False, 5) in kinds


def test_unterminated_last_legacy_line_is_left_out_only_when_it_looks_cut() -> None:
    lines = legacy_lines(make_run(4))
    cut = [*lines[:-1], lines[-1][:-30]]  # no newline, cut inside a value
    parsed = parse_log(cut)
    assert parsed.steps == [1, 2, 3]
    assert [s.kind for s in parsed.sentinels if s.kind == "truncated_step_line"] == ["truncated_step_line"]
    whole = [*lines[:-1], lines[-1].rstrip("\n")]  # no final newline but complete
    assert parse_log(whole).steps == [1, 2, 3, 4]


def test_damaged_step_line_in_the_middle_is_fatal() -> None:
    lines = mindformers_lines(make_run(6))
    lines[2] = lines[2].replace(" }", "")  # lost its closing brace: something else wrote into the line
    parsed = parse_log(lines, source="npu.log")
    assert 3 not in parsed.steps
    bad = [s for s in parsed.sentinels if s.kind == "malformed_step_line"]
    assert len(bad) == 1
    assert bad[0].fatal
    assert bad[0].line_no == 3


def test_truncated_line_before_a_restart_is_not_fatal() -> None:
    first = mindformers_lines(make_run(5), max_steps=10)
    first[-1] = first[-1][:-40] + "\n"  # cut inside the message
    resumed = mindformers_lines(make_run(7, start=4), max_steps=10)
    parsed = parse_log(first + resumed)
    assert parsed.steps == list(range(1, 11))
    assert [(s.kind, s.fatal) for s in parsed.sentinels] == [("truncated_step_line", False)]


def test_nan_loss_is_a_fatal_sentinel_with_its_line() -> None:
    run = make_run(5)
    run.lm_loss[2] = float("nan")
    parsed = parse_log(mindformers_lines(run))
    assert np.isnan(parsed.frame.loc[3, "lm_loss"])
    (s,) = parsed.sentinels
    assert (s.kind, s.fatal, s.line_no) == ("non_finite_value", True, 3)
    assert "loss:        nan" in s.text


def test_megatron_nan_iteration_is_fatal_and_the_missing_loss_stays_missing() -> None:
    lines = megatron_lines(make_run(4))
    lines[1] = megatron_line(2, 4, consumed_samples=16, elapsed_ms=700.0, lr=1e-4, global_batch_size=8,
                             losses={"lm loss": float("nan")}, grad_norm=None, nan_iterations=1) + "\n"
    parsed = parse_log(lines)
    assert np.isnan(parsed.frame.loc[2, "lm_loss"])
    assert [(s.kind, s.fatal, s.line_no) for s in parsed.sentinels] == [("nan_iterations", True, 2)]


def test_grad_norm_printed_nan_on_every_step_is_not_computed_not_diverged() -> None:
    lines = [mindformers_pynative_line(s, 5, loss=3.0, step_time_ms=700, lr=1e-5, grad_norm=None) + "\n"
             for s in range(1, 6)]
    parsed = parse_log(lines)
    assert "grad_norm" not in parsed.frame.columns
    assert [(s.kind, s.fatal) for s in parsed.sentinels] == [("grad_norm_not_reported", False)]


def test_a_nan_loss_beside_an_unreported_grad_norm_names_only_the_loss() -> None:
    lines = [mindformers_pynative_line(s, 5, loss=float("nan") if s == 3 else 3.0, step_time_ms=700, lr=1e-5,
                                       grad_norm=None) + "\n" for s in range(1, 6)]
    parsed = parse_log(lines)
    assert "grad_norm" not in parsed.frame.columns
    assert [(s.kind, s.fatal, s.message) for s in parsed.sentinels] == [
        ("grad_norm_not_reported", False, "grad_norm is NaN on every step: the norm was not computed; column dropped"),
        ("non_finite_value", True, "lm_loss is NaN or inf"),
    ]


def test_parse_log_file_reads_and_reports_unreadable_inputs(tmp_path: Path) -> None:
    path = write(tmp_path / "gpu.log", megatron_lines(make_run(3)))
    parsed = parse_log_file(path)
    assert parsed.source == str(path)
    assert parsed.steps == [1, 2, 3]
    assert parsed.lines_read == 3
    with pytest.raises(LogParseError, match=r"missing.log: file not found"):
        parse_log_file(tmp_path / "missing.log")
    with pytest.raises(LogParseError, match=r"is a directory"):
        parse_log_file(tmp_path)
    binary = tmp_path / "binary.log"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(LogParseError, match=r"binary.log: not a text log: binary content \(a NUL byte"):
        parse_log_file(binary)
    undecodable = tmp_path / "latin1.log"  # text that is not UTF-8 is still a log: its bytes are replaced
    undecodable.write_bytes(b"\xff\xfe garbage\n")
    with pytest.raises(LogParseError, match=r"no step lines"):
        parse_log_file(undecodable)


def test_unknown_format_name_is_refused() -> None:
    with pytest.raises(LogParseError, match=r"unknown log format 'torch'"):
        parse_log([], fmt="torch")  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [5, 1500])
def test_the_frame_is_the_same_whichever_reader_builds_its_columns(monkeypatch: pytest.MonkeyPatch,
                                                                    steps: int) -> None:
    """Short logs' columns are read in numpy, long ones' with pandas' record reader (alignflow.logs.steps): the
    same log gives the same frame, dtypes included, either way (a column missing on some lines, a NaN count, an
    integer column)."""
    import pandas as pd

    from alignflow.logs import steps as steps_module

    lines = []
    for s in range(1, steps + 1):
        line = megatron_line(s, steps, consumed_samples=8 * s, elapsed_ms=650.0, lr=1e-4, global_batch_size=8,
                             losses={"lm loss": 2.0 + 1.0 / s, **({"mtp_1 loss": 2.5} if s % 3 else {})},
                             grad_norm=1.5, throughput_tflops=120.0)
        lines.append(line)
    frames = []
    for records_from in (0, 10**9):
        monkeypatch.setattr(steps_module, "_RECORDS_FROM", records_from)
        frames.append(parse_log(lines).frame)
    pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True)
    assert str(frames[0]["consumed_samples"].dtype) == "Int64"
    assert frames[0]["mtp_1_loss"].isna().sum() == steps // 3
