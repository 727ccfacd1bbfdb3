"""`alignflow compare` and `alignflow logs parse`: exit codes 0 pass / 1 fail / 2 bad input, JSON shape, files."""

from __future__ import annotations

import json
import re
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


@pytest.mark.integration
def test_console_exit_codes_are_0_pass_1_fail_2_bad_input(logs: dict[str, Path], subprocess_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    ok = run_cli(["compare", str(logs["ref"]), str(logs["good"]), "--json"], subprocess_env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["verdict"] == "pass"
    fail = run_cli(["compare", str(logs["ref"]), str(logs["bad"]), "--out", str(tmp_path / "r"), "--no-plots"],
                   subprocess_env)
    assert fail.returncode == 1, fail.stderr
    assert "verdict: FAIL" in fail.stdout
    assert (tmp_path / "r" / "report.html").is_file()
    missing = run_cli(["compare", str(tmp_path / "nope.log"), str(logs["good"])], subprocess_env)
    assert missing.returncode == 2
    assert "nope.log: file not found" in missing.stderr


def test_json_output_has_the_issue_shape(logs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["compare", str(logs["ref"]), str(logs["good"]), "--json"])
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
    fatal = runner.invoke(app, ["compare", str(logs["nan"]), str(logs["good"]), "--json"])
    assert fatal.exit_code == 1
    assert json.loads(fatal.stdout)["sentinels"]["reference"][0]["kind"] == "megatron_nonstrict_load"
    empty = runner.invoke(app, ["compare", str(logs["ref"]), str(logs["empty"])])
    assert empty.exit_code == 2
    assert "no step lines" in empty.stderr


def test_criteria_file_replaces_the_defaults_and_a_bad_one_is_bad_input(logs: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    loose = tmp_path / "loose.yaml"
    loose.write_text("criteria:\n  - {metric: lm_loss, statistic: mean_rel, threshold: '5%'}\n")
    result = CliRunner().invoke(app, ["compare", str(logs["ref"]), str(logs["bad"]), "--criteria", str(loose),
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert [c["threshold"] for c in json.loads(result.stdout)["criteria"]] == [0.05]
    broken = tmp_path / "broken.yaml"
    broken.write_text("criteria:\n  - {metric: lm_loss, statistic: median, threshold: 1}\n")
    bad = CliRunner().invoke(app, ["compare", str(logs["ref"]), str(logs["bad"]), "--criteria", str(broken)])
    assert bad.exit_code == 2
    assert f"{broken}:2: criteria.0.statistic" in bad.stderr


def test_labels_name_every_log_and_one_log_is_a_usage_error(logs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["compare", str(logs["ref"]), str(logs["good"]), "--labels", "npu"])
    assert result.exit_code == 2
    assert "--labels needs 2 distinct names separated by commas (reference first)" in result.stderr
    alone = CliRunner().invoke(app, ["compare", str(logs["ref"])])
    assert alone.exit_code == 2
    assert "compare REF TEST [TEST...]" in alone.stderr


def test_one_reference_against_several_test_logs(logs: dict[str, Path], tmp_path: Path) -> None:
    """`compare REF A B`: one comparison per test log, the verdict fails when one fails, one curve per log."""
    runner = CliRunner()
    args = ["compare", str(logs["ref"]), str(logs["good"]), str(logs["bad"])]
    as_json = runner.invoke(app, [*args, "--json"])
    assert as_json.exit_code == 1, as_json.output
    doc = json.loads(as_json.stdout)
    assert doc["verdict"] == "fail"
    assert doc["reference"] == "gpu"
    assert [(c["label"], c["verdict"]) for c in doc["comparisons"]] == [("npu", "pass"), ("npu_bad", "fail")]
    assert doc["comparisons"][1]["inputs"]["test"]["source"].endswith("npu_bad.log")
    table = runner.invoke(app, [*args, "--out", str(tmp_path / "r"), "--labels", "GPU,NPU-a,NPU-b"])
    assert table.exit_code == 1
    assert table.stdout.startswith("verdict: FAIL  (NPU-a / NPU-b vs GPU")
    assert "NPU-b: |me(lm_loss)| < 0.001 failed: value +0.0" in table.stdout
    page = (tmp_path / "r" / "report.html").read_text()
    curves = re.findall(r'"name":"(GPU|NPU-a|NPU-b)"', page)
    assert {"GPU", "NPU-a", "NPU-b"} <= set(curves)
    assert (tmp_path / "r" / "aligned-2.csv").is_file()


def test_criteria_read_the_same_in_the_terminal_the_json_and_the_report(logs: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """One notation everywhere (issue 20): a relative threshold is a percentage in the label, the table and the
    JSON text; the value is the same string in the CLI table, the HTML report and the markdown summary."""
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["compare", str(logs["ref"]), str(logs["bad"]), "--json"]).stdout)
    step_rel = next(c for c in doc["criteria"] if c["statistic"] == "step_rel")
    assert step_rel["label"] == "|step_rel(lm_loss, step 1)| < 0.5%"
    assert step_rel["threshold_text"] == "0.5%"
    assert step_rel["value_text"].endswith("%")
    failed = doc["criteria"][0]
    assert not failed["passed"]
    assert failed["drivers"]
    assert failed["first_outside"] == 1
    out = runner.invoke(app, ["compare", str(logs["ref"]), str(logs["bad"]), "--out", str(tmp_path / "r"),
                              "--no-plots"], env={"COLUMNS": "160"})
    page = (tmp_path / "r" / "report.html").read_text()
    summary = (tmp_path / "r" / "summary.md").read_text()
    for c in doc["criteria"]:
        assert re.search(rf"│\s+{re.escape(c['value_text'])} │", out.stdout), c
        assert f">{c['value_text']}</td>" in page
        assert f" {c['value_text']} | {c['threshold_text']} |" in summary
    assert "-0.0000" not in page + summary + out.stdout


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


def test_logs_parse_prints_values_without_binary_float_noise(logs: dict[str, Path]) -> None:
    """Megatron >= 0.16's first interval is de-averaged (2 * avg - first), which leaves binary tails such as
    10.842030000000001 in the float; CSV and JSON print what the log resolves, not that tail."""
    runner = CliRunner()
    as_csv = runner.invoke(app, ["logs", "parse", str(logs["ref"]), "--csv"])
    as_json = runner.invoke(app, ["logs", "parse", str(logs["ref"]), "--json"])
    assert as_csv.exit_code == as_json.exit_code == 0
    for text in (as_csv.stdout, as_json.stdout):
        numbers = re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", text)
        assert numbers
        noisy = [n for n in numbers if len(n.split("e")[0].replace("-", "").replace(".", "").lstrip("0")) > 15]
        assert noisy == []
    row = next(r for r in json.loads(as_json.stdout) if r["step"] == 2)
    assert row["lm_loss"] == float(f"{row['lm_loss']:.6f}")  # the de-averaged cell: as printed, 6 decimals


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
    assert runner.invoke(app, ["compare", str(gpu), str(npu)]).exit_code == 0
    failed = runner.invoke(app, ["compare", str(gpu), str(npu), "--first-interval", "raw"])
    assert failed.exit_code == 1
    assert "|me(lm_loss)| < 0.001 failed" in failed.stdout
    assert "reference: first interval (raw)" in failed.stdout
    bad = runner.invoke(app, ["compare", str(gpu), str(npu), "--first-interval", "maybe"])
    assert bad.exit_code == 2


def test_a_report_is_titled_by_the_logs_it_compares(logs: dict[str, Path], tmp_path: Path) -> None:
    """Issue 47: every standalone report was 'alignflow comparison', whatever it compared."""
    args = ["compare", str(logs["ref"]), str(logs["good"]), "--no-plots", "--out"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "<title>test (npu.log) vs reference (gpu.log)</title>" in (tmp_path / "a" / "report.html").read_text()
    named = CliRunner().invoke(app, [*args, str(tmp_path / "b"), "--labels", "GPU,NPU"])
    assert named.exit_code == 0, named.output
    assert (tmp_path / "b" / "summary.md").read_text().startswith("# NPU (npu.log) vs GPU (gpu.log)\n")
    mine = CliRunner().invoke(app, [*args, str(tmp_path / "c"), "--title", "mine"])
    assert mine.exit_code == 0, mine.output
    assert "<title>mine</title>" in (tmp_path / "c" / "report.html").read_text()
