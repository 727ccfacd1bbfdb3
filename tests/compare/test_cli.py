"""`alignflow compare` and `alignflow logs parse`: exit codes 0 pass / 1 fail / 2 bad input, JSON shape, files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed, write


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("logs")
    ref_run = make_run(80, seed=31)
    good = perturbed(ref_run, loss_noise=1e-4, grad_noise=1e-3, seed=32)
    bad = perturbed(ref_run, loss_noise=1e-4, loss_offset=0.01, seed=33)
    return {
        "ref": write(root / "gpu.log", megatron_lines(ref_run)),
        "good": write(root / "npu.log", mindformers_lines(good)),
        "bad": write(root / "npu_bad.log", mindformers_lines(bad)),
        "empty": write(root / "empty.log", ["nothing to see\n"]),
        "nan": write(root / "gpu_nan.log", ["load_return: None\n", *megatron_lines(ref_run)]),
    }


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_console_exit_codes_are_0_pass_1_fail_2_bad_input(logs: dict[str, Path], subprocess_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    ok = run_cli(["compare", str(logs["good"]), str(logs["ref"]), "--json"], subprocess_env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verdict"] == "pass"
    fail = run_cli(["compare", str(logs["bad"]), str(logs["ref"]), "--out", str(tmp_path / "r"), "--no-plots"],
                   subprocess_env)
    assert fail.returncode == 1, fail.stderr
    assert "verdict: FAIL" in fail.stdout
    assert (tmp_path / "r" / "report.html").is_file()
    missing = run_cli(["compare", str(logs["good"]), str(tmp_path / "nope.log")], subprocess_env)
    assert missing.returncode == 2
    assert "nope.log: file not found" in missing.stderr


def test_json_output_has_the_issue_shape(logs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["compare", str(logs["good"]), str(logs["ref"]), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "pass"
    assert [c["metric"] for c in doc["criteria"]] == ["lm_loss", "grad_norm", "lm_loss", "lm_loss", "lm_loss"]
    assert {"metric", "statistic", "value", "threshold", "passed"} <= set(doc["criteria"][0])
    assert set(doc["metrics"]) == {"lm_loss", "mtp_1_loss", "load_balancing_loss", "grad_norm", "lr"}
    assert doc["metrics"]["lm_loss"]["step_rel"].keys() == {"1"}
    assert doc["steps"]["compared"] == 80
    assert doc["steps"]["only_test"] == []
    assert doc["sentinels"] == {"test": [], "reference": []}


def test_fatal_sentinel_fails_and_no_step_lines_is_bad_input(logs: dict[str, Path]) -> None:
    runner = CliRunner()
    fatal = runner.invoke(app, ["compare", str(logs["good"]), str(logs["nan"]), "--json"])
    assert fatal.exit_code == 1
    assert json.loads(fatal.stdout)["sentinels"]["reference"][0]["kind"] == "megatron_nonstrict_load"
    empty = runner.invoke(app, ["compare", str(logs["empty"]), str(logs["ref"])])
    assert empty.exit_code == 2
    assert "no step lines" in empty.stderr


def test_criteria_file_replaces_the_defaults_and_a_bad_one_is_bad_input(logs: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    loose = tmp_path / "loose.yaml"
    loose.write_text("criteria:\n  - {metric: lm_loss, statistic: mean_rel, threshold: '5%'}\n")
    result = CliRunner().invoke(app, ["compare", str(logs["bad"]), str(logs["ref"]), "--criteria", str(loose),
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert [c["threshold"] for c in json.loads(result.stdout)["criteria"]] == [0.05]
    broken = tmp_path / "broken.yaml"
    broken.write_text("criteria:\n  - {metric: lm_loss, statistic: median, threshold: 1}\n")
    bad = CliRunner().invoke(app, ["compare", str(logs["bad"]), str(logs["ref"]), "--criteria", str(broken)])
    assert bad.exit_code == 2
    assert f"{broken}:2: criteria.0.statistic" in bad.stderr


def test_labels_must_be_two_names(logs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["compare", str(logs["good"]), str(logs["ref"]), "--labels", "npu"])
    assert result.exit_code == 2
    assert "--labels needs two names" in result.stderr


def test_logs_parse_json_csv_and_table(logs: dict[str, Path]) -> None:
    runner = CliRunner()
    as_json = runner.invoke(app, ["logs", "parse", str(logs["ref"]), "--json"])
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.stdout)
    assert len(rows) == 80
    assert rows[0]["step"] == 1
    assert isinstance(rows[0]["consumed_samples"], int)
    assert {"lm_loss", "grad_norm", "lr", "mtp_1_loss", "nan_iterations"} <= set(rows[0])
    as_csv = runner.invoke(app, ["logs", "parse", str(logs["good"]), "--csv", "--format", "mindformers"])
    assert as_csv.exit_code == 0
    header = as_csv.stdout.splitlines()[0].split(",")
    assert header[:3] == ["step", "lm_loss", "mtp_1_loss"]
    table = runner.invoke(app, ["logs", "parse", str(logs["ref"])])
    assert table.stdout.splitlines()[0].startswith(f"{logs['ref']}: megatron (megatron), 80 step(s)")
    both = runner.invoke(app, ["logs", "parse", str(logs["ref"]), "--json", "--csv"])
    assert both.exit_code == 2


def test_logs_parse_check_exits_1_on_a_fatal_line(logs: dict[str, Path]) -> None:
    runner = CliRunner()
    plain = runner.invoke(app, ["logs", "parse", str(logs["nan"]), "--json"])
    assert plain.exit_code == 0
    assert "FATAL" in plain.stderr
    checked = runner.invoke(app, ["logs", "parse", str(logs["nan"]), "--check"])
    assert checked.exit_code == 1
    wrong = runner.invoke(app, ["logs", "parse", str(logs["ref"]), "--format", "mindformers"])
    assert wrong.exit_code == 2


def test_first_interval_option_on_parse_and_compare(tmp_path: Path) -> None:
    """A correct 0.16+ run: its step-2 line is the mean of steps 1 and 2 unless the parser undoes it."""
    from dataclasses import replace

    run = make_run(20, seed=35)
    run = replace(run, lm_loss=[run.lm_loss[0] + 1.0, *run.lm_loss[1:]])
    gpu = write(tmp_path / "gpu.log", megatron_lines(run))
    npu = write(tmp_path / "npu.log", mindformers_lines(perturbed(run, loss_noise=1e-4, seed=36)))
    runner = CliRunner()
    auto = runner.invoke(app, ["logs", "parse", str(gpu), "--json"])
    raw = runner.invoke(app, ["logs", "parse", str(gpu), "--json", "--first-interval", "raw"])
    assert auto.exit_code == raw.exit_code == 0
    step2 = json.loads(auto.stdout)[1]["lm_loss"], json.loads(raw.stdout)[1]["lm_loss"]
    assert step2[0] == pytest.approx(run.lm_loss[1], abs=2e-5)
    assert step2[1] == pytest.approx((run.lm_loss[0] + run.lm_loss[1]) / 2, abs=1e-5)
    assert f"note: {gpu}: first interval (auto): step 2 de-averaged" in auto.stderr
    assert "first_interval=raw; step 2 is the mean of iterations 1..2" in raw.stderr
    assert runner.invoke(app, ["compare", str(npu), str(gpu)]).exit_code == 0
    failed = runner.invoke(app, ["compare", str(npu), str(gpu), "--first-interval", "raw"])
    assert failed.exit_code == 1
    assert "|me(lm_loss)| < 0.001 failed" in failed.stdout
    assert "reference: first interval (raw)" in failed.stdout
    bad = runner.invoke(app, ["compare", str(npu), str(gpu), "--first-interval", "maybe"])
    assert bad.exit_code == 2
