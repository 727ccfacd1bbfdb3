"""The live display of a run (issue 40: the NPU line showed a raw log fragment for ~25 s, step names were cut to
`npu_re…` at 120 columns, the timer moved every ~11 s)."""

from __future__ import annotations

import io

from rich.console import Console

from alignflow.cli.progress import ConsoleProgress, fit_row, row_fields
from alignflow.runner.progress import StepProgress

TRAINING = StepProgress("npu_reload_train", "ascend", "running", 65.0, iteration=20, total=30,
                        metrics={"lm_loss": 5.0134, "grad_norm": 1.2345}, s_per_step=0.18, eta_s=29.0)


def _row(p: StepProgress, width: int, age_s: float = 0.0) -> str:
    return fit_row(p.step, len(p.step), row_fields(p, age_s), width)


def test_at_80_columns_a_training_keeps_its_name_step_loss_rate_and_eta() -> None:
    row = _row(TRAINING, 80)
    assert row == "npu_reload_train  ascend  step 20/30  lm_loss 5.013  0.18 s/step  ETA 29s  1m05s"
    assert len(row) <= 80
    assert _row(TRAINING, 120) == ("npu_reload_train  ascend  step 20/30  lm_loss 5.013  grad_norm 1.234  "
                                   "0.18 s/step  ETA 29s  1m05s")
    narrow = _row(TRAINING, 66)
    assert narrow == "npu_reload_train  step 20/30  lm_loss 5.013  0.18 s/step  ETA 29s"  # the name, never cut


def test_between_two_observations_the_time_counts_up_and_the_eta_down() -> None:
    assert _row(TRAINING, 120, age_s=4.0).endswith("0.18 s/step  ETA 25s  1m09s")
    assert _row(TRAINING, 120, age_s=40.0).endswith("ETA 0s  1m45s")


def test_before_the_first_step_line_the_row_says_what_it_waits_for_not_the_jobs_output() -> None:
    starting = StepProgress("npu_reload_train", "ascend", "running", 12.0,
                            last_output="[WARNING] ME(4242:1402,MainProcess):2026-12-06 [mindspore/ops.py:99] deprec")
    assert _row(starting, 80) == "npu_reload_train  ascend  running  12s"
    assert "deprec" in starting.line()  # the task's log keeps it
    queued = StepProgress("gpu_train", "cuda", "waiting for a job slot", 75.0, note="waiting for one of 1 slot(s)")
    assert _row(queued, 80) == "gpu_train  cuda  waiting for a job slot  1m15s  waiting for one of 1 slot(s)"


def test_on_a_terminal_rows_are_redrawn_with_their_whole_names_and_log_lines_go_above_them() -> None:
    out = io.StringIO()
    now = [100.0]
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    with ConsoleProgress(console, clock=lambda: now[0]) as display:
        display.progress(TRAINING)
        display.progress(StepProgress("gpu_train", "cuda", "running", 3.0))
        now[0] += 3.0
        display.log_line("12:00:00.000 | WARNING | Flow run 'align-demo-x' - Ctrl-C, cancelling it")
        display.step_ended("gpu_train", "cancelled", "")
    text = out.getvalue()
    assert "npu_reload_train  ascend  step 20/30" in text
    assert "npu_re…" not in text
    assert "Ctrl-C, cancelling it\n" in text
    assert "gpu_train         cancelled" in text


def test_a_wait_for_another_run_is_shown_without_verbose_and_other_messages_are_not() -> None:
    out = io.StringIO()
    with ConsoleProgress(Console(file=out, width=120, color_system=None)) as display:
        display.message("npu_base_train: launched on ascend (job /w/jobs/x)")
        display.message("waiting for npu_base_train (4338c05b1b66) (run d8154d9a7179 is creating it)")
    assert out.getvalue() == "waiting for npu_base_train (4338c05b1b66) (run d8154d9a7179 is creating it)\n"
