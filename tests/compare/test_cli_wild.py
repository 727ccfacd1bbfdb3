"""`alignflow compare` / `logs parse` on logs in the wild: 0 pass, 1 failed alignment or invalid run, 2 unreadable
input with the file, the line and the reason, never a traceback (issue 15)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app

WILD = Path(__file__).resolve().parent.parent / "data" / "logs" / "wild"


@pytest.mark.integration
def test_ms_swift_log_compares_in_a_real_process_without_a_traceback(subprocess_env: dict[str, str]) -> None:
    log = str(WILD / "ms_swift_sft.log")
    done = subprocess.run([sys.executable, "-m", "alignflow", "compare", log, log, "--no-plots"], env=subprocess_env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "verdict: PASS" in done.stdout


@pytest.mark.parametrize(("name", "code", "kind"), [
    ("megatron_grad_norm_nan.log", 1, "non_finite_value"),
    ("megatron_loss_missing.log", 1, "missing_loss"),
    ("mindformers_health_abort.log", 1, "mf_training_aborted"),
    ("mindformers_skip_data.log", 0, "mf_skipped_data"),
    ("megatron_deepspeed_bloom.log", 0, "deepspeed_overflow_skip"),
    ("megatron_gap.log", 0, "step_gap"),
    ("megatron_broken_key.log", 0, "unknown_field"),
])
def test_logs_parse_check_exit_code_and_sentinel(name: str, code: int, kind: str) -> None:
    result = CliRunner().invoke(app, ["logs", "parse", str(WILD / name), "--check"])
    assert result.exit_code == code, result.output
    assert f": {kind}: " in result.stderr


def test_require_checkpoint_loaded_on_compare_and_parse() -> None:
    test, ref = str(WILD / "compare_scratch_test.log"), str(WILD / "compare_scratch_reference.log")
    runner = CliRunner()
    assert runner.invoke(app, ["compare", ref, test]).exit_code == 0
    required = runner.invoke(app, ["compare", ref, test, "--require", "checkpoint_loaded"])
    assert required.exit_code == 1
    assert "the test log never shows checkpoint_loaded (required)" in required.stdout
    parse = runner.invoke(app, ["logs", "parse", test, "--check", "--require", "checkpoint_loaded"])
    assert parse.exit_code == 1
    assert "FATAL: " in parse.stderr
    assert "required line not found: checkpoint_loaded" in parse.stderr
    assert runner.invoke(app, ["logs", "parse", test, "--check"]).exit_code == 0
    unknown = runner.invoke(app, ["compare", ref, test, "--require", "weights_loaded"])
    assert unknown.exit_code == 2
    assert "unknown --require weights_loaded; known: " in unknown.stderr


def test_min_overlap_option() -> None:
    test, ref = str(WILD / "compare_overlap_test.log"), str(WILD / "compare_overlap_reference.log")
    runner = CliRunner()
    assert runner.invoke(app, ["compare", ref, test]).exit_code == 1
    assert runner.invoke(app, ["compare", ref, test, "--min-overlap", "1"]).exit_code == 0
    assert runner.invoke(app, ["compare", ref, test, "--min-overlap", "0"]).exit_code == 2


def test_nemo2_log_reads_and_an_unreadable_step_line_names_file_and_line(tmp_path: Path) -> None:
    runner = CliRunner()
    nemo = runner.invoke(app, ["logs", "parse", str(WILD / "nemo2_progress.log"), "--format", "nemo", "--check"])
    assert nemo.exit_code == 0, nemo.output
    assert nemo.stdout.startswith(f"{WILD / 'nemo2_progress.log'}: nemo (nemo2), 10 step(s)")
    cut = tmp_path / "cut.log"
    cut.write_text("Training epoch 0, iteration 0/99 | lr: 1.5e-05 | reduced_train_loss 10.79\n")
    bad = runner.invoke(app, ["logs", "parse", str(cut)])
    assert bad.exit_code == 2
    assert f"error: {cut}:1: no step lines" in bad.stderr
    assert "field 'reduced_train_loss 10.79' is not `name: value`" in bad.stderr


def test_a_parser_defect_is_exit_2_with_file_and_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard for defects of the parser itself (the fuzz test shows none is reached on any input)."""
    from alignflow.logs.formats import FORMATS

    def broken(text: str, with_resolution: bool = True) -> None:
        raise KeyError("remaining time")

    monkeypatch.setitem(FORMATS, "megatron", replace(FORMATS["megatron"], parse_step=broken))
    log = WILD / "ms_swift_sft.log"
    result = CliRunner().invoke(app, ["compare", str(log), str(log)])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"error: {log}:1: internal parser error on this line (KeyError: 'remaining time')" in result.stderr
