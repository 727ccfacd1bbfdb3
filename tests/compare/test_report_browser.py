"""The HTML report in a real browser (Debian's Chromium, headless, driven by Playwright): at 1400 px and 800 px no
table cell wraps a number, the curves come before the criteria and are on the first screen, nothing is fetched,
and the curves are interactive (hover shows both sides, the legend toggles a series, the log button works).

Assertions are on layout boxes and on plotly's own state, not on pixels. Screenshots of each width are written
beside the report (`$ALIGNFLOW_SCREENSHOTS`, when set, receives copies).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from alignflow.compare.comparison import compare
from alignflow.compare.report import write_report
from alignflow.config.criteria import default_criteria
from alignflow.logs import parse_log
from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed
from tests.recorded_run import snapshot

pytestmark = pytest.mark.integration

VIEWPORT_HEIGHT = 900

# Per numeric cell: the number of line boxes its text occupies (1 = not wrapped).
LINES_OF_NUMBERS = """() => [...document.querySelectorAll('td.num')].map(td => {
  const r = document.createRange(); r.selectNodeContents(td);
  const tops = new Set([...r.getClientRects()].map(b => Math.round(b.top)));
  return [td.textContent, tops.size];
})"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from alignflow.compare.context import FingerprintRow, ReportContext, StepRow

    ref_run = make_run(120, seed=21)
    test_run = perturbed(ref_run, loss_noise=1e-4, loss_offset=0.003, seed=22)
    result = compare(parse_log(mindformers_lines(test_run), source="ascend:/w/npu.log"),
                     parse_log(megatron_lines(ref_run), source="cuda:/w/gpu.log"), default_criteria())
    context = ReportContext(
        run_id="5f1c0a9e2b7d", experiment="glm-mini", description="GLM mini: MindFormers on Ascend vs Megatron",
        steps=(StepRow("npu_base_train", "ran", "ascend", 754.0, 0), StepRow("convert_bf16", "ran", "cpu", 12.5, 0),
               StepRow("gpu_train", "ran", "cuda", 401.2, 0),
               StepRow("compare", "ran", "controller", 3.1, 0, "wrote this report")),
        fingerprints=(FingerprintRow("data", "d" * 64, 4096, "cpu:/w/data.bin"),
                      FingerprintRow("bf16_ckpt", "f" * 64, 3 * 2**30, "cpu:/w/bf16", "convert_bf16")),
        snapshots={"NPU": snapshot("ascend", mindspore="2.10.0"), "GPU": snapshot("cuda", torch="2.6.0")})
    out = tmp_path_factory.mktemp("report")
    return write_report(result, out, title="GLM mini — run 5f1c0a9e2b7d", labels=("NPU", "GPU"),
                        context=context).html


def _open(browser: Any, report: Path, width: int) -> tuple[Any, list[str]]:
    fetched: list[str] = []
    page = browser.new_page(viewport={"width": width, "height": VIEWPORT_HEIGHT})
    page.on("request", lambda request: fetched.append(request.url))
    page.goto(report.as_uri(), wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('.plot .main-svg').length >= "
                           "document.querySelectorAll('.plot').length * 1", timeout=60_000)
    return page, fetched


@pytest.mark.parametrize("width", [1400, 800])
def test_numbers_never_wrap_and_the_curves_are_on_the_first_screen(browser: Any, report: Path, width: int) -> None:
    page, fetched = _open(browser, report, width)
    try:
        assert [u for u in fetched if not u.startswith(("file://", "data:", "blob:"))] == []
        cells = page.evaluate(LINES_OF_NUMBERS)
        assert len(cells) > 50  # criteria, metrics, performance, steps: the numbers are there and right-aligned
        assert [c for c in cells if c[1] > 1] == []
        assert page.evaluate("() => getComputedStyle(document.querySelector('td.num')).textAlign") == "right"
        box = page.locator(".plot").first.bounding_box()
        criteria = page.locator("#criteria").bounding_box()
        assert box is not None
        assert criteria is not None
        assert box["y"] + box["height"] <= criteria["y"]  # the curves come before the criteria
        assert box["y"] < VIEWPORT_HEIGHT * 0.5  # and start in the first screen's upper half
        assert box["width"] > width * 0.85
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width  # tables scroll, not the page
        shot = report.with_name(f"report-{width}.png")
        page.screenshot(path=str(shot), full_page=False)
        page.screenshot(path=str(report.with_name(f"report-{width}-full.png")), full_page=True)
        target = os.environ.get("ALIGNFLOW_SCREENSHOTS")
        if target:
            for name in (shot.name, f"report-{width}-full.png"):
                shutil.copy(report.with_name(name), Path(target) / name)
    finally:
        page.close()


def test_hover_shows_both_sides_and_the_legend_and_log_buttons_work(browser: Any, report: Path) -> None:
    page, _ = _open(browser, report, 1400)
    try:
        plot = page.locator("#plot-0")
        area = page.locator("#plot-0 .nsewdrag").first.bounding_box()
        assert area is not None
        page.mouse.move(area["x"] + area["width"] * 0.5, area["y"] + area["height"] * 0.5)
        page.wait_for_selector("#plot-0 .hoverlayer .legend, #plot-0 .hoverlayer .hovertext", timeout=10_000)
        hover = plot.locator(".hoverlayer").text_content() or ""
        assert "NPU" in hover
        assert "GPU" in hover
        assert page.evaluate("() => document.getElementById('plot-0').layout.yaxis.type") in ("linear", "-")
        plot.locator(".updatemenu-button", has_text="log").click()
        page.wait_for_function("() => document.getElementById('plot-0').layout.yaxis.type === 'log'")
        plot.locator(".legend .traces", has_text="GPU").first.locator(".legendtoggle").click()
        page.wait_for_function("() => document.getElementById('plot-0').data[0].visible === 'legendonly'")
        names = page.evaluate("() => document.getElementById('plot-0').data.map(t => t.name)")
        assert names[:2] == ["GPU", "NPU"]
        assert "band: its criteria and the printed resolution" in names
        assert any((n or "").startswith("steps driving a failed criterion") for n in names)
        shapes = page.evaluate("() => document.getElementById('plot-0').layout.shapes.map(s => s.x0)")
        assert 1 in shapes  # the first-divergence marker at step 1
    finally:
        page.close()


# Per figure: its metric, and the steps whose drawn error lies outside the drawn band (the band's upper edge is the
# unnamed trace of the 'band' legend group), as plotly.js holds them after drawing.
PANEL_OUTSIDE = """() => [...document.querySelectorAll('.plot')].map(div => {
  const data = div.querySelector('.js-plotly-plot').data;
  const upper = data.find(t => t.legendgroup === 'band' && !t.fill);
  const error = data.find(t => (t.name || '').startsWith('error '));
  const width = new Map();
  if (upper) { Array.from(upper.x).forEach((x, i) => { if (upper.y[i] !== null) width.set(x, upper.y[i]); }); }
  const out = [];
  Array.from(error.x).forEach((x, i) => {
    const e = error.y[i];
    if (e !== null && width.has(x) && Math.abs(e) > width.get(x) * (1 + 1e-9)) out.push(x);
  });
  return [div.dataset.metric, out];
})"""


def test_what_the_summary_says_of_each_metric_is_what_its_panel_draws(browser: Any, report: Path) -> None:
    """Issue 40: a PASS report said "every metric stays inside its band" above an mtp_1_loss panel whose error
    sat outside its shaded band. Read both from the page as a reader sees them."""
    page, _ = _open(browser, report, 1400)
    try:
        summary = page.locator("#summary").inner_text()
        panels = page.evaluate(PANEL_OUTSIDE)
        assert len(panels) >= 4
        for metric, outside in panels:
            if outside:
                assert f"{metric} at step {outside[0]} ({len(outside)} step(s) outside" in summary, (metric, summary)
            else:
                assert f"{metric} at step" not in summary, (metric, summary)
        assert dict(panels)["lm_loss"]  # the fixture's offset run leaves lm_loss's band: the check has teeth
    finally:
        page.close()


# Per table: its box's width and the width its content needs (a table wider than its box is cut at the box's edge).
TABLES_OVER_THEIR_BOX = """() => [...document.querySelectorAll('.scroll')].filter(b => b.offsetParent !== null)
  .map(b => [b.querySelector('table').id || b.previousElementSibling?.textContent || '?', b.clientWidth,
             b.scrollWidth]).filter(([, box, content]) => content > box)"""


@pytest.fixture(scope="module")
def report_with_long_paths(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run's report whose fingerprints are where a real state dir keeps them: paths of 100-odd characters with no
    space in them."""
    from alignflow.compare.context import FingerprintRow, ReportContext

    run = make_run(30, seed=3)
    result = compare(parse_log(mindformers_lines(run), source="ascend:/w/npu.log"),
                     parse_log(megatron_lines(run), source="cuda:/w/gpu.log"), default_criteria())
    work = "/home/engineer/checkouts/alignflow/.alignflow/hosts/cpu/artifacts"
    prints = tuple(FingerprintRow(name, c * 64, 3 * 2**30, f"cpu:{work}/{step}/{c * 12}/{name}/iter_0000001/"
                                  f"__0_0.distcp", step)
                   for name, step, c in (("bf16_ckpt", "convert_bf16", "a"), ("megatron_ckpt", "convert_megatron", "b"),
                                         ("npu_log", "npu_reload_train", "c")))
    out = tmp_path_factory.mktemp("long-paths")
    return write_report(result, out, title="t", labels=("NPU", "GPU"),
                        context=ReportContext(run_id="5f1c0a9e2b7d", experiment="demo", fingerprints=prints)).html


@pytest.mark.parametrize("width", [1400, 1920])
def test_every_table_fits_its_box_long_paths_wrap(browser: Any, report_with_long_paths: Path, width: int) -> None:
    """Issue 47: the Fingerprints table ran past its box at 1400 and 1920 px, its paths cut at the edge. A path
    wraps inside its cell (anywhere: it has no space), a sha256 and a number stay on one line."""
    page, _ = _open(browser, report_with_long_paths, width)
    try:
        assert page.evaluate(TABLES_OVER_THEIR_BOX) == []
        where = page.locator("#fingerprints-table td", has_text="__0_0.distcp").first
        assert where.evaluate("td => td.scrollWidth <= td.clientWidth")  # wrapped, not cut
        lines = ("td => { const r = document.createRange(); r.selectNodeContents(td); "
                 "return r.getClientRects().length; }")
        assert page.locator("#fingerprints-table td.sha").first.evaluate(lines) == 1
        assert page.locator("#fingerprints-table td", has_text="convert_megatron").first.evaluate(lines) == 1
    finally:
        page.close()
