"""Every table at 80 columns (and at 120): no token split, no column lost (issue 47).

At 80 columns the criteria wrapped mid-token (`|me(lm_los` / `s)| <`), the metrics table of several logs ran
past the right edge (its "diverges at" column and border cut), and `history` wrapped experiment names
(`demo-sam` / `e-format`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.cli.history import _runs_table
from alignflow.cli.show import print_view
from alignflow.runview import ArtifactView, CriterionView, RunView, StepView
from alignflow.store import RunStatus
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed, write

WIDTHS = [80, 120]
BOX_START, BOX_END = "┏┃┡│└", "┓┃┩│┘"


def assert_fits(text: str, width: int, words: list[str]) -> None:
    """Every line within `width`, every table line closed by its right border, every word whole on one line."""
    lines = text.splitlines()
    assert [line for line in lines if len(line) > width] == [], text
    assert [line for line in lines if line[:1] in BOX_START and line.rstrip()[-1:] not in BOX_END] == [], text
    split = [w for w in dict.fromkeys(words)
             if not any(re.search(rf"(?<!\S){re.escape(w)}(?!\S)", line) for line in lines)]
    assert split == [], text


def _words(*cells: str) -> list[str]:
    return [word for cell in cells for word in cell.split()]


@pytest.mark.parametrize("width", WIDTHS)
def test_the_compare_tables_of_several_logs(tmp_path: Path, width: int) -> None:
    ref = make_run(40, seed=31)
    logs = [write(tmp_path / "gpu.log", megatron_lines(ref)),
            write(tmp_path / "npu.log", mindformers_lines(perturbed(ref, loss_noise=1e-4, seed=32))),
            write(tmp_path / "npu_bad.log", mindformers_lines(perturbed(ref, loss_noise=1e-4, loss_offset=0.01,
                                                                       seed=33)))]
    done = CliRunner().invoke(app, ["compare", *map(str, logs), "--labels", "GPU,NPU-a,NPU-b", "--no-plots"],
                              env={"COLUMNS": str(width)})
    assert done.exit_code == 1, done.output
    criteria = ["|me(lm_loss)| < 0.001", "|mean_rel(lm_loss, excluding step 2)| < 1%", "|me(grad_norm)| < 0.01"]
    headers = ["criterion", "value", "threshold", "result", "diverges at", "driving steps", "metric", "ME",
               "max |e|", "mean rel", "max rel"]
    metrics = ["lm_loss", "mtp_1_loss", "grad_norm", "load_balancing_loss" if width >= 100 else "lb_loss"]
    assert_fits(done.stdout, width, _words(*criteria, *headers, *metrics, "NPU-a vs GPU", "NPU-b vs GPU"))
    assert done.stdout.count("diverges") == 4  # both tables of both logs keep their last column
    if width < 100:
        assert "abbreviated: lb_loss = load_balancing_loss" in done.stdout


def _view() -> RunView:
    when = datetime(2026, 12, 6, 7, 55, 23, tzinfo=UTC)
    def artifact(name: str) -> ArtifactView:
        return ArtifactView(name=name, host="cpu", path=f"/state/{name}", kind="file", sha256="54cf34dc541b" * 5,
                            size_bytes=11_300_000)

    steps = tuple(StepView(step=name, step_run_id="a3aee885014e", status="ran", host=host, exit_code=0,
                           started=None, finished=None, duration_s=38.8, cache_key=None, error=None, inputs={},
                           artifacts=tuple(artifact(a) for a in outputs), reused_from=reused,
                           reused_from_run=reused)
                  for name, host, outputs, reused in (
                      ("npu_base_train", "ascend", ("base_ckpt", "npu_base_log"), None),
                      ("convert_megatron", "cpu", ("megatron_ckpt",), "fd1fe6428108"),
                      ("npu_reload_train", "ascend", ("npu_log",), None),
                      ("compare", "controller", ("report",), None)))
    criteria = tuple(CriterionView(label=label, value=1e-6, value_text=value, threshold_text=threshold, passed=False,
                                   first_outside=4, driving_steps=(29, 45, 74, 15, 33), note="", source="")
                     for label, value, threshold in (("|me(lm_loss)| < 0.001", "-1.6e-06", "0.001"),
                                                     ("|step_rel(lm_loss, step 1)| < 0.5%", "0.00002%", "0.5%"),
                                                     ("|mean_rel(lm_loss, excluding step 2)| < 1%", "0.000036%",
                                                      "1%")))
    return RunView(run_id="f50d0dafb90d", experiment="demo", status="completed", verdict="fail", trigger="cli",
                   parent_id=None, code_version="alignflow 0.1.0", started=when, finished=None, duration_s=105.0,
                   error=None, report=None, steps=steps, criteria=criteria, snapshots={})


@pytest.mark.parametrize("width", WIDTHS)
def test_the_run_summarys_steps_and_criteria(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                             width: int) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    view = _view()
    print_view(view)
    words = _words(*(s.step for s in view.steps), *(c.label for c in view.criteria), "diverges at", "driving steps",
                   "outputs (sha256)", "controller", "threshold", "54cf34dc541b", "megatron_ckpt", "fd1fe6428108")
    assert_fits(capsys.readouterr().out, width, words)


@pytest.mark.parametrize("width", WIDTHS)
def test_history(width: int) -> None:
    runs = [SimpleNamespace(id=f"{i:012x}", experiment=name, config_sha256="60ca5964" * 8, parent_id=None,
                            trigger="deployment", status=RunStatus.COMPLETED, verdict="fail",
                            started_at=datetime(2026, 12, 6, 7, 55, tzinfo=UTC), duration_s=105.0)
            for i, name in enumerate(["demo-same-format", "demo-matrix/03_ep1", "demo"])]
    console = Console(width=width, record=True)
    console.print(_runs_table(runs, width))  # type: ignore[arg-type]
    words = _words(*(r.id for r in runs), *(r.experiment for r in runs), "duration")
    if width >= 120:
        words += ["60ca5964", "deployment", "2026-12-06", "completed"]
    else:
        words += ["completed,", "FAIL"]
    assert_fits(console.export_text(), width, words)
