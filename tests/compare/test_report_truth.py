"""The report tells what its panels show (issue 40, item 4): the sentences above the curves, the tables and the
figures read one band per metric, every metric gets its first divergence (criterion or not), and a metric whose
criterion failed is never called inside. Each test reads the generated files (HTML, markdown, JSON)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from alignflow.compare.comparison import Comparison, compare
from alignflow.compare.interactive import metric_figure
from alignflow.compare.report import ReportFiles, write_report
from alignflow.config.criteria import Criterion, default_criteria
from alignflow.logs import parse_log
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed

STEPS = 60


def _report(tmp_path: Path, test_run: Any, ref_run: Any, criteria: list[Criterion] | None = None,
            noise_floor: dict[str, float] | None = None, plots: bool = True) -> tuple[Comparison, ReportFiles]:
    result = compare(parse_log(mindformers_lines(test_run), source="ascend:/w/npu.log"),
                     parse_log(megatron_lines(ref_run), source="cuda:/w/gpu.log"),
                     default_criteria() if criteria is None else criteria, noise_floor=noise_floor)
    return result, write_report(result, tmp_path / "report", title="t", labels=("NPU", "GPU"), plots=plots)


def _summary(page: str) -> str:
    """The text of the summary list above the curves."""
    top = page[page.index('id="summary"'):page.index("</section>", page.index('id="summary"'))]
    return re.sub(r"<[^>]+>", " ", top).replace("&#39;", "'")


def _figures(page: str) -> dict[str, list[dict[str, Any]]]:
    """metric -> the plotly traces of its figure, as the page hands them to plotly.js."""
    decoder = json.JSONDecoder()
    out = {}
    for match in re.finditer(r'<div class="plot" data-metric="([^"]+)">', page):
        call = page.index("Plotly.newPlot(", match.end())
        start = page.index("[", page.index(",", call))
        out[match.group(1)] = decoder.raw_decode(page, start)[0]
    return out


def _listed(value: Any) -> Any:
    """numpy arrays as the page's JSON has them (NaN as null)."""
    return [None if isinstance(x, float) and x != x else x for x in np.asarray(value).tolist()]


def _panel_outside(traces: list[dict[str, Any]], label: str = "NPU") -> list[int]:
    """The steps whose drawn error lies outside the drawn band (the band's upper edge is the unnamed trace of the
    'band' legend group), as a reader of the figure sees them."""
    upper = next(t for t in traces if t.get("legendgroup") == "band" and not t.get("fill"))
    error = next(t for t in traces if t.get("name") == f"error {label}")
    width = {int(x): y for x, y in zip(upper["x"], upper["y"], strict=True) if y is not None}
    return [int(x) for x, e in zip(error["x"], error["y"], strict=True)
            if e is not None and int(x) in width and abs(e) > width[int(x)] * (1 + 1e-9)]


def test_a_metric_without_a_criterion_gets_its_first_divergence_in_every_view(tmp_path: Path) -> None:
    ref_run = make_run(STEPS, seed=3)
    test_run = perturbed(ref_run, loss_noise=1e-6, seed=4)
    # the MTP head 8.8% off from step 20 on (the run): no criterion names mtp_1_loss
    test_run = replace(test_run, mtp=[[v * (1.088 if s >= 20 else 1.0) for s, v in zip(test_run.steps, test_run.mtp[0],
                                                                                        strict=True)]])
    result, files = _report(tmp_path, test_run, ref_run, plots=False)  # the page's figures: the next test
    assert not any(c.metric == "mtp_1_loss" for c in result.criteria)
    doc = json.loads(files.json.read_text())
    div = doc["metrics"]["mtp_1_loss"]["divergence"]
    assert div["first_step"] == 20
    assert div["steps_outside"] == STEPS - 19
    assert not div["own_criteria"]
    assert div["basis"].startswith("lm_loss's criteria (no criterion of its own)")
    md = files.markdown.read_text()
    assert "first outside its band: mtp_1_loss at step 20 (41 step(s) outside" in md
    row = next(line for line in md.splitlines() if line.startswith("| mtp_1_loss |"))
    assert row.split(" | ")[12] == "20"  # the metrics table's "diverges at" column
    assert "mtp_1_loss at step 20" in _summary(files.html.read_text())
    figure = json.loads(json.dumps(metric_figure([result], "mtp_1_loss", ("NPU", "GPU")), default=_listed))
    assert _panel_outside(figure["data"])[0] == 20  # what the page's mtp_1_loss panel draws


def test_the_sentences_and_the_panels_read_one_band(tmp_path: Path) -> None:
    """The demo's PASS: MTP and aux losses differ by a few units of the printed digit (fp32 kernels), far inside
    lm_loss's thresholds. The report said 'every metric stays inside its band' while the mtp_1_loss panel drew a
    resolution-only band with the error outside it at most steps."""
    ref_run = make_run(STEPS, seed=11)
    rng = np.random.default_rng(12)
    test_run = replace(ref_run, lm_loss=[v + 2e-6 * rng.choice([-1, 1]) for v in ref_run.lm_loss],
                       mtp=[[v + 3e-6 * rng.choice([-1, 1]) for v in ref_run.mtp[0]]])
    result, files = _report(tmp_path, test_run, ref_run)
    assert result.passed
    page = files.html.read_text()
    figures = _figures(page)
    summary = _summary(page)
    assert set(figures) == set(result.metrics)
    for metric, traces in figures.items():
        outside = _panel_outside(traces)
        if outside:
            assert f"{metric} at step {outside[0]} ({len(outside)} step(s) outside" in summary, (metric, summary)
        else:
            assert not re.search(rf"\b{metric} at step", summary), (metric, summary)
    assert "every metric stays inside its band" in summary
    assert _panel_outside(figures["mtp_1_loss"]) == []
    band = next(t for t in figures["mtp_1_loss"] if t.get("fill"))
    assert band["name"] == "band: lm_loss's criteria (no criterion of its own) and the printed resolution"


def test_a_metric_whose_criterion_failed_is_never_called_inside(tmp_path: Path) -> None:
    """A measured noise floor widens grad_norm's per-step band past the criterion's threshold: every step stays
    inside it while the mean error fails |me| < 0.01. The report said 'inside: grad_norm'."""
    ref_run = make_run(STEPS, seed=5)
    test_run = replace(perturbed(ref_run, loss_noise=1e-6, seed=6),
                       grad_norm=[v + 0.015 for v in ref_run.grad_norm])
    result, files = _report(tmp_path, test_run, ref_run, noise_floor={"grad_norm": 0.02}, plots=False)
    me = next(r for r in result.criteria if r.metric == "grad_norm")
    assert not me.passed
    assert result.metrics["grad_norm"].divergence is not None
    assert result.metrics["grad_norm"].divergence.first_step is None
    for text in (files.markdown.read_text(), _summary(files.html.read_text())):
        assert "stays inside its band" not in text
        assert not re.search(r"inside its band at every step: [^;\n]*grad_norm", text)
        assert ("inside its per-step band at every step but failing a criterion over the run: grad_norm "
                "(|me(grad_norm)| &lt; 0.01 failed)" in text or
                "inside its per-step band at every step but failing a criterion over the run: grad_norm "
                "(|me(grad_norm)| < 0.01 failed)" in text)


@pytest.mark.parametrize("threshold", ["3x noise"])
def test_an_unmeasured_noise_threshold_leaves_the_metric_its_resolution_band(tmp_path: Path, threshold: str) -> None:
    """A '3x noise' criterion with no noise measured fails and bounds no step; the metric keeps the band its printed
    digits give, and the report does not call a failing metric inside."""
    ref_run = make_run(STEPS, seed=7)
    test_run = replace(ref_run, grad_norm=[v + 0.2 for v in ref_run.grad_norm])
    crit = [Criterion(metric="lm_loss", statistic="me", threshold=0.001),
            Criterion(metric="grad_norm", statistic="me", threshold=threshold)]
    result, files = _report(tmp_path, test_run, ref_run, criteria=crit, plots=False)
    div = json.loads(files.json.read_text())["metrics"]["grad_norm"]["divergence"]
    assert div["first_step"] == 1
    assert div["basis"] == "the printed resolution (no criterion)"
    assert "grad_norm at step 1" in files.markdown.read_text()
    assert not result.passed


def test_a_speed_ratio_is_given_only_between_sides_timed_alike(tmp_path: Path) -> None:
    from alignflow.compare.context import ReportContext, TimingConditions

    ref_run = make_run(STEPS, seed=8)
    test_run = perturbed(ref_run, loss_noise=1e-6, seed=9, time_scale=0.25)  # the NPU "4x faster"
    result = compare(parse_log(mindformers_lines(test_run), source="npu.log"),
                     parse_log(megatron_lines(ref_run), source="gpu.log"), default_criteria())
    plain = write_report(result, tmp_path / "plain", labels=("NPU", "GPU"), plots=False).markdown.read_text()
    assert "NPU is 4.00x faster than GPU" in plain
    assert "how each side was timed is not recorded: a ratio holds only between timings taken alike" in plain
    alone = TimingConditions(device="NVIDIA H100 80GB HBM3 x8", machine="gpu-a", measured_in="run1", load_1m=0.5,
                             cpus=64)
    cases = {
        "loaded": (replace(alone, device="Ascend NPU (npu-smi)", machine="npu-a", load_1m=130.0, cpus=64),
                   "NPU's host was loaded when its run started, GPU's was not"),
        "shared": (replace(alone, machine="npu-a", beside=("convert_megatron",), shared=0.6),
                   "they shared their machines for different parts of their time (NPU 60% beside convert_megatron, "
                   "GPU 0%)"),
        "cached": (replace(alone, machine="npu-a", measured_in="run0", cached=True),
                   "timed in different runs (NPU in run run0 (cached), GPU in run run1)"),
    }
    for name, (npu, why) in cases.items():
        context = ReportContext(run_id="run1", timing={"NPU": npu, "GPU": alone})
        files = write_report(result, tmp_path / name, labels=("NPU", "GPU"), plots=False, context=context)
        md = files.markdown.read_text()
        assert f"no speed ratio: the two sides were not timed alike: {why}" in md, name
        assert "faster" not in md, name
        assert f"NPU timed: {npu.describe()}" in md
        assert json.loads(files.json.read_text())["timing"]["sides"]["NPU"]["text"] == npu.describe()
    alike = ReportContext(run_id="run1", timing={"NPU": replace(alone, machine="npu-a"), "GPU": alone})
    md = write_report(result, tmp_path / "alike", labels=("NPU", "GPU"), plots=False, context=alike).markdown
    assert "NPU is 4.00x faster than GPU (samples/s: " in md.read_text()
    assert "warm-up steps; timed alike)" in md.read_text()
