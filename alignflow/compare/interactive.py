"""Interactive curves of the HTML report: plotly figures whose plotly.js the page inlines, so it opens offline.

Per compared metric one figure: every log's curve above (the reference wide and translucent beneath, each test
log thin on top, so two curves that agree stay distinguishable), the signed error (test - reference) beneath
with the metric's band (alignflow.compare.divergence) shaded, ME dashed, the steps that drive a failed
criterion marked, and a vertical marker at the first step that leaves the band. Hover shows every log's value at
the step; the legend toggles series; the buttons switch the upper axis between linear and log. Where the error
dwarfs the band (a failing curve: its band a hairline at the error's scale), a third panel draws |error| in band
widths on a log axis, whose line at 1 is the band's edge (`divergence.in_band_widths`).

Long runs are thinned to the points that matter at screen resolution: per bucket of steps, each series' minimum
and maximum (the same steps for every series, so hover still shows both sides of one step), plus the first
divergence and the driving steps. Every drawn point is a real step with its logged value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.io as pio

from alignflow.compare.comparison import Comparison
from alignflow.compare.divergence import PULL_FLOOR, in_band_widths
from alignflow.compare.formatting import fmt_stat
from alignflow.compare.statistics import FloatArray, IntArray

BUCKETS = 1500
REFERENCE_COLOR = "#1e8449"  # the seeds' GPU green
TEST_COLORS = ("#c0392b", "#2e86c1", "#8e44ad", "#d35400", "#17a589", "#b7950b", "#5d6d7e")  # NPU red first
CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False,
          "modeBarButtonsToRemove": ["select2d", "lasso2d"], "toImageButtonOptions": {"format": "png", "scale": 2}}
HEIGHT_PX = 520
PULL_HEIGHT_PX = 640  # with the third panel (error in band widths)


def keep_indices(n: int, series: Sequence[FloatArray], must: Sequence[int] = (), buckets: int = BUCKETS) -> IntArray:
    """Indices into n steps: all of them for short runs, else each series' min and max per bucket + `must`."""
    if n <= 4 * buckets:
        return np.arange(n)
    size = math.ceil(n / buckets)
    pad = size * buckets - n
    keep = [np.array([0, n - 1]), np.asarray(must, dtype=np.int64)]
    base = np.arange(buckets) * size
    for y in series:
        a = np.concatenate([y, np.full(pad, np.nan)]).reshape(buckets, size)
        ok = np.isfinite(a)
        has = ok.any(axis=1)
        lo = np.where(ok, a, np.inf).argmin(axis=1) + base
        hi = np.where(ok, a, -np.inf).argmax(axis=1) + base
        keep += [lo[has], hi[has]]
    out: IntArray = np.unique(np.concatenate(keep)).astype(np.int64)
    return out[(out >= 0) & (out < n)]


Figure = dict[str, Any]  # a plotly figure as plotly.js reads it: {"data": [...], "layout": {...}}
AXIS = {"gridcolor": "#eceff1", "linecolor": "#b0b7bd", "showline": True, "zerolinecolor": "#90a4ae"}
TOP, BOTTOM = {"xaxis": "x", "yaxis": "y"}, {"xaxis": "x2", "yaxis": "y2"}
PULL = {"xaxis": "x3", "yaxis": "y3"}


def metric_figure(comparisons: Sequence[Comparison], metric: str, labels: Sequence[str]) -> Figure:
    """The figure of `metric` across every comparison (same reference; labels = tests..., reference).

    Written as plotly.js's own figure structure (two stacked y axes on one shared x axis) rather than through
    plotly's Python objects, whose validation and copying cost seconds per figure at 100,000 steps.
    """
    first = comparisons[0]
    steps = first.aligned.index.to_numpy(dtype=np.int64)
    for c in comparisons[1:]:
        steps = np.union1d(steps, c.aligned.index.to_numpy(dtype=np.int64))
    ref = first.reference.frame[metric].reindex(steps).to_numpy(dtype=float, na_value=np.nan)
    tests = [c.test.frame[metric].reindex(steps).to_numpy(dtype=float, na_value=np.nan) if metric in c.metrics
             else np.full(len(steps), np.nan) for c in comparisons]
    errors = [c.aligned[f"{metric}_error"].reindex(steps).to_numpy(dtype=float, na_value=np.nan)
              if metric in c.metrics else np.full(len(steps), np.nan) for c in comparisons]
    marks = _marked_steps(comparisons, metric)
    must = np.searchsorted(steps, np.asarray(sorted(marks), dtype=np.int64))
    idx = keep_indices(len(steps), [ref, *tests, *errors], must=must.tolist())
    x = steps[idx]

    data: list[dict[str, Any]] = [_line(x, ref[idx], labels[-1], REFERENCE_COLOR, 5, TOP, opacity=0.4)]
    for i, (c, y) in enumerate(zip(comparisons, tests, strict=True)):
        color = TEST_COLORS[i % len(TEST_COLORS)]
        data.append(_line(x, y[idx], labels[i], color, 1.4, TOP))
        if metric in c.metrics:
            data += _error_traces(c, metric, labels[i], color, steps, errors[i], idx, i)
    pulls = [in_band_widths(c.metrics[metric].band, steps, e) if metric in c.metrics else None
             for c, e in zip(comparisons, errors, strict=True)]
    for i, pull in enumerate(pulls):
        if pull is not None:
            data.append({**_line(x, pull[idx], f"|error {labels[i]}| / band", TEST_COLORS[i % len(TEST_COLORS)],
                                 1.1, PULL), "hovertemplate": "%{y:.3g} band widths"})
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    pulled = any(p is not None for p in pulls)
    if pulled:  # inside the band: below 1 in its own widths
        shapes.append({"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "yref": "y3", "y0": PULL_FLOOR, "y1": 1,
                       "fillcolor": "rgba(46,134,193,0.15)", "line": {"width": 0}, "layer": "below"})
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y3", "y0": 1, "y1": 1,
                       "line": {"color": "#2e86c1", "width": 1}})
    for c in comparisons:
        div = c.metrics[metric].divergence if metric in c.metrics else None
        if div is not None and div.first_step is not None:
            shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": div.first_step, "x1": div.first_step,
                           "y0": 0, "y1": 1, "line": {"color": "#7d3c98", "width": 1.2, "dash": "dot"}})
            notes.append({"x": div.first_step, "xref": "x", "y": 0.38, "yref": "paper", "yanchor": "bottom",
                          "xanchor": "left", "showarrow": False, "text": f" first outside band: step {div.first_step}",
                          "font": {"size": 11, "color": "#7d3c98"}, "bgcolor": "rgba(255,255,255,0.7)"})
    layout = {
        "title": {"text": f"<b>{metric}</b>", "x": 0, "xanchor": "left", "y": 0.985, "font": {"size": 14}},
        "height": PULL_HEIGHT_PX if pulled else HEIGHT_PX, "margin": {"l": 70, "r": 20, "t": 70, "b": 40},
        "hovermode": "x unified",
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "font": {"size": 11},
                   "traceorder": "normal"},
        "paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"family": "system-ui, sans-serif", "size": 12},
        "xaxis": {**AXIS, "anchor": "y", "matches": "x2", "showticklabels": False},
        "xaxis2": {**AXIS, "anchor": "y2", **({"showticklabels": False} if pulled else {"title": {"text": "step"}})},
        "yaxis": {**AXIS, "domain": [0.5, 1.0] if pulled else [0.41, 1.0], "title": {"text": metric},
                  "exponentformat": "e"},
        "yaxis2": {**AXIS, "domain": [0.26, 0.45] if pulled else [0.0, 0.35], "exponentformat": "e",
                   "zeroline": True, "zerolinecolor": "#555",
                   "title": {"text": f"{'/'.join(labels[:-1])} − {labels[-1]}"}},
        **({"xaxis3": {**AXIS, "anchor": "y3", "matches": "x2", "title": {"text": "step"}},
            "yaxis3": {**AXIS, "domain": [0.0, 0.2], "type": "log", "title": {"text": "|error| / band"}}}
           if pulled else {}),
        "shapes": shapes, "annotations": notes,
        "updatemenus": [{"type": "buttons", "direction": "left", "x": 1.0, "xanchor": "right", "y": 1.1,
                         "yanchor": "bottom", "showactive": True, "font": {"size": 11},
                         "buttons": [{"label": "linear", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                                     {"label": "log", "method": "relayout", "args": [{"yaxis.type": "log"}]}]}],
    }
    return {"data": data, "layout": layout}


def _line(x: Any, y: Any, name: str, color: str, width: float, axes: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"type": "scatter", "mode": "lines", "x": x, "y": y, "name": name, "line": {"color": color, "width": width},
            "hovertemplate": "%{y:.6g}", **axes, **extra}


def _error_traces(c: Comparison, metric: str, label: str, color: str, steps: IntArray, error: FloatArray,
                  idx: IntArray, i: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    mc = c.metrics[metric]
    b = mc.band
    if b is not None and len(b.steps) and i == 0:  # the band the comparison computed: the one its sentences read
        width = np.full(len(steps), np.nan)
        width[np.searchsorted(steps, b.steps)] = np.where(np.isfinite(b.width), b.width, np.nan)
        if np.isfinite(width).any():
            w = width[idx]
            out.append({"type": "scatter", "mode": "lines", "x": steps[idx], "y": w, "line": {"width": 0},
                        "hoverinfo": "skip", "showlegend": False, "legendgroup": "band", **BOTTOM})
            out.append({"type": "scatter", "mode": "lines", "x": steps[idx], "y": -w, "line": {"width": 0},
                        "fill": "tonexty", "fillcolor": "rgba(46,134,193,0.15)", "legendgroup": "band",
                        "name": f"band: {b.basis}", "hoverinfo": "skip", **BOTTOM})
    out.append({**_line(steps[idx], error[idx], f"error {label}", color, 1.1, BOTTOM), "hovertemplate": "%{y:.3e}"})
    me = mc.stats.get("me")
    if math.isfinite(me):
        out.append({**_line([int(steps[0]), int(steps[-1])], [me, me],
                            f"ME {label} {fmt_stat(me, 'me', mc.resolution, mc.magnitude)}", color, 1, BOTTOM),
                    "line": {"color": color, "width": 1, "dash": "dash"}, "hoverinfo": "skip"})
    driven = sorted({d.step for r in c.criteria if not r.passed and r.metric == metric for d in r.drivers})
    if driven:
        at = np.searchsorted(steps, np.asarray(driven))
        out.append({"type": "scatter", "mode": "markers", "x": steps[at], "y": error[at],
                    "name": f"steps driving a failed criterion ({label})", "hovertemplate": "%{y:.3e}",
                    "marker": {"symbol": "x", "size": 9, "color": color}, **BOTTOM})
    return out


def _marked_steps(comparisons: Sequence[Comparison], metric: str) -> set[int]:
    out: set[int] = set()
    for c in comparisons:
        mc = c.metrics.get(metric)
        if mc is not None and mc.divergence is not None:
            out |= {s for s in (mc.divergence.first_step, mc.divergence.worst_step) if s is not None}
        out |= {d.step for r in c.criteria if r.metric == metric for d in r.drivers}
    return out


def metrics_of(comparisons: Sequence[Comparison]) -> list[str]:
    """Metrics compared in any of the comparisons, in the first one's order."""
    seen: list[str] = []
    for c in comparisons:
        seen += [m for m in c.metrics if m not in seen]
    return seen


def figure_divs(comparisons: Sequence[Comparison], labels: Sequence[str]) -> dict[str, str]:
    """metric -> `<div>` + `<script>` drawing its figure (plotly.js itself is inlined once by the page)."""
    out: dict[str, str] = {}
    for n, metric in enumerate(metrics_of(comparisons)):
        fig = metric_figure(comparisons, metric, labels)
        out[metric] = pio.to_html(fig, include_plotlyjs=False, full_html=False, config=CONFIG, validate=False,
                                  div_id=f"plot-{n}", default_height=f"{HEIGHT_PX}px", default_width="100%")
    return out


def plotly_js() -> str:
    """plotly.js as shipped inside the plotly package (inlined: the report fetches nothing)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())
