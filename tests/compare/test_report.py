"""write_report: a self-contained HTML report, a markdown summary, CSV, PNGs and JSON that say what compare said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from alignflow.compare.comparison import Comparison, compare
from alignflow.compare.context import FingerprintRow, ReportContext, StepRow
from alignflow.compare.plots import envelope
from alignflow.compare.report import write_report
from alignflow.config.criteria import default_criteria
from alignflow.logs import parse_log
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def failed() -> Comparison:
    ref_run = make_run(120, seed=21)
    test_run = perturbed(ref_run, loss_noise=1e-4, loss_offset=0.003, seed=22)
    test_lines = mindformers_lines(test_run)
    ref_lines = ["load_return: None <script>alert(1)</script>\n", *megatron_lines(ref_run)[:110]]
    return compare(parse_log(test_lines, source="npu.log"), parse_log(ref_lines, source="gpu.log"),
                   default_criteria())


def test_report_files_are_written_and_agree_with_the_comparison(failed: Comparison, tmp_path: Path) -> None:
    files = write_report(failed, tmp_path / "report", title="GLM mini: NPU vs GPU", labels=("NPU", "GPU"),
                         fingerprints={"data": "5b207e7d" * 8, "checkpoints": {"bf16": "ab" * 32}})
    assert files.html.parent == tmp_path / "report"
    assert sorted(files.pngs) == sorted(failed.metrics)
    for png in files.pngs.values():
        assert png.read_bytes().startswith(PNG_MAGIC)
    assert json.loads(files.json.read_text()) == {**failed.to_json(),
                                                  "fingerprints": {"data": "5b207e7d" * 8,
                                                                   "checkpoints": {"bf16": "ab" * 32}}}
    leftovers = [p.name for p in files.html.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_html_is_self_contained_with_inline_plotly_and_escaped_text(failed: Comparison, tmp_path: Path) -> None:
    files = write_report(failed, tmp_path, title="GLM mini", labels=("NPU", "GPU"), fingerprints={"data": "f" * 64})
    page = files.html.read_text(encoding="utf-8")
    head, body = page.split("</head>", 1)
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)\s*=""", page)  # nothing loaded from anywhere
    assert "plotly.js" in head.lower()
    assert len(head) > 3_000_000
    assert len(re.findall(r'<div class="plot" data-metric="', body)) == len(failed.metrics)
    assert '<span class="verdict fail">FAIL</span>' in page
    assert "|me(lm_loss)| &lt; 0.001" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page
    assert "f" * 64 in page
    assert "megatron_nonstrict_load" in page
    assert "only in GPU: none" in page
    assert "only in NPU: 111-120" in page


def test_a_failed_criterion_names_its_steps_above_the_curves(failed: Comparison, tmp_path: Path) -> None:
    page = write_report(failed, tmp_path, labels=("NPU", "GPU")).html.read_text()
    me = failed.criteria[0]
    assert not me.passed
    assert me.first_outside == 1
    assert len(me.drivers) == 5
    summary = page.index('id="summary"')
    curves = page.index('id="curves"')
    criteria = page.index('id="criteria"')
    assert summary < curves < criteria
    top = page[summary:curves]
    steps = ", ".join(str(d.step) for d in me.drivers)
    assert f"|me(lm_loss)| &lt; 0.001 failed: value {me.value_text} (spread over the run: the largest terms, " \
           f"steps {steps}, make" in top
    assert "first outside its band: lm_loss at step 1" in top


def test_markdown_summary_for_prefect_artifacts(failed: Comparison, tmp_path: Path) -> None:
    md = write_report(failed, tmp_path, title="GLM mini", labels=("NPU", "GPU")).markdown.read_text()
    assert md.startswith("# GLM mini\n")
    assert "**Verdict: FAIL** — NPU vs GPU" in md
    assert "| \\|me(lm_loss)\\| < 0.001 |" in md
    assert "| \\|step_rel(lm_loss, step 1)\\| < 0.5% |" in md
    assert "- 1 fatal sentinel line(s) in the reference log: megatron_nonstrict_load" in md
    assert "| metric | n | ME | mean \\|e\\| |" in md
    cells = re.compile(r"(?<!\\)\|")  # unescaped pipes delimit cells
    header = next(line for line in md.splitlines() if line.startswith("| metric | n |"))
    row = next(line for line in md.splitlines() if line.startswith("| lm_loss |"))
    assert len(cells.findall(header)) == len(cells.findall(row)) == 15
    rule = md.splitlines()[md.splitlines().index(header) + 1]
    assert rule.startswith("|---|---:|---:|")  # numbers right-aligned


def test_report_shows_the_run_steps_fingerprints_and_environment_differences(failed: Comparison,
                                                                              tmp_path: Path) -> None:
    context = ReportContext(
        run_id="0123456789ab", experiment="glm-mini", description="GLM mini, NPU against GPU",
        steps=(StepRow("npu_base_train", "ran", "ascend", 754.2, 0), StepRow("compare", "failed", None, None, None,
                                                                              "boom")),
        fingerprints=(FingerprintRow("bf16_ckpt", "ab" * 32, 3 * 2**20, "cpu:/ckpt", "convert_bf16"),
                      FingerprintRow("data", "cd" * 32, 1024, "cpu:/data.bin")),
        snapshots={"NPU": {"host": "ascend", "taken_at": "t1", "packages": {"mindspore": "2.10.0", "numpy": "1.26.4"},
                           "repos": {"mindformers": {"commit": "abc", "dirty": True}},
                           "env": {"HCCL_DETERMINISTIC": "true"}},
                   "GPU": {"host": "cuda", "taken_at": "t2", "packages": {"torch": "2.6.0", "numpy": "1.26.4"},
                           "repos": {"megatron": {"commit": "def", "dirty": False}}, "env": {}}})
    files = write_report(failed, tmp_path, labels=("NPU", "GPU"), context=context, plots=False)
    page = files.html.read_text()
    assert "run 0123456789ab" in page
    assert "GLM mini, NPU against GPU" in page
    assert ">12 min 34 s</td>" in page
    assert ">3.0 MiB</td>" in page
    env = page[page.index('id="environment"'):]
    assert "Environment (7 differences)" in env
    diff_rows = re.findall(r'<tr class="diff">\n?<td[^>]*>([^<]+)</td>', env)
    assert diff_rows == ["packages.mindspore", "packages.torch", "repos.megatron.commit", "repos.megatron.dirty",
                         "repos.mindformers.commit", "repos.mindformers.dirty", "env.HCCL_DETERMINISTIC"]
    assert "taken_at" not in env
    assert "1 setting(s) that agree" in env  # packages.numpy
    md = files.markdown.read_text()
    assert "## Environment differences" in md
    assert "| packages.torch | — | 2.6.0 |" in md


def test_csv_holds_every_step_of_either_log(failed: Comparison, tmp_path: Path) -> None:
    csv = write_report(failed, tmp_path, plots=False).csv
    table = pd.read_csv(csv, index_col="step")
    assert table.index.tolist() == list(range(1, 121))
    assert table["in_reference"].sum() == 110
    assert table["lm_loss_error"].iloc[:110].tolist() == pytest.approx(
        failed.aligned["lm_loss_error"].iloc[:110].tolist(), rel=1e-11)


def test_no_plots_means_no_pngs_and_no_images(failed: Comparison, tmp_path: Path) -> None:
    files = write_report(failed, tmp_path, plots=False)
    assert files.pngs == {}
    assert list(tmp_path.glob("*.png")) == []
    page = files.html.read_text()
    assert "<img" not in page
    assert 'id="curves"' not in page
    assert "plotly" not in page.lower()


def test_envelope_keeps_the_extremes_of_long_curves() -> None:
    import numpy as np

    x = np.arange(100_000, dtype=float)
    y = np.sin(x / 500.0)
    y[31_337] = 5.0
    ex, ey = envelope(x, y, buckets=1000)
    assert len(ex) == 2000
    assert ey.max() == 5.0
    assert ey.min() == pytest.approx(y.min())
    short_x, short_y = envelope(x[:100], y[:100])
    assert short_y.tolist() == y[:100].tolist()
    assert short_x.tolist() == x[:100].tolist()


def test_report_says_which_megatron_steps_were_de_averaged(tmp_path: Path) -> None:
    ref_run = make_run(30, seed=23)
    test_run = perturbed(ref_run, loss_noise=1e-4, seed=24)
    result = compare(parse_log(mindformers_lines(test_run), source="npu.log"),
                     parse_log(megatron_lines(ref_run), source="gpu.log"), default_criteria())
    files = write_report(result, tmp_path, labels=("NPU", "GPU"), plots=False)
    md = files.markdown.read_text()
    assert "| side | log | format | rank | steps | repeated steps (last kept) | restarts | de-averaged steps |" in md
    assert re.search(r"^\| NPU \| npu.log \|.*\| n/a \|$", md, re.M)
    assert re.search(r"^\| GPU \| gpu.log \|.*\| 2 \|$", md, re.M)
    assert "- GPU: first interval (auto): step 2 de-averaged with step 1's line (lm_loss, load_balancing_loss, " \
           "mtp_1_loss; rounding error up to 3x the printed one): microsecond timestamps" in md
    page = files.html.read_text()
    assert "<li>GPU: first interval (auto): step 2 de-averaged" in page
    assert "- lm_loss: test: 6 decimals, reference: 7 significant digits; reference step 2 de-averaged" in md
