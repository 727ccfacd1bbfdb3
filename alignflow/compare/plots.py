"""PNG plots of a comparison (for artifacts and papers; the HTML report draws interactive ones): every log's curve
of a metric above, the signed error (test - reference) beneath with its band and first-divergence marker, and
where the error dwarfs the band (its band a hairline at the error's scale) |error| in band widths at the bottom, on a
log axis whose line at 1 is the band's edge (`divergence.in_band_widths`).

matplotlib's object API on the Agg canvas (no pyplot state, no display), so plotting is safe in a worker thread
and in CI. Long runs are drawn through a min/max envelope per horizontal bucket: a 100,000-step curve becomes
~4,000 vertices that draw exactly the same picture at the figure's resolution, instead of 100,000 that cost
seconds per figure.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from alignflow.compare.comparison import Comparison
from alignflow.compare.divergence import PULL_FLOOR, in_band_widths
from alignflow.compare.formatting import fmt_stat
from alignflow.compare.names import THUMBNAIL_METRICS
from alignflow.compare.statistics import FloatArray

BUCKETS = 2000  # envelope buckets per curve: about the figure's width in pixels
REFERENCE_COLOR = "#1e8449"  # the seeds' GPU green
COLORS = ("#c0392b", "#2e86c1", "#8e44ad", "#d35400", "#17a589")  # test logs, NPU red first


def envelope(x: FloatArray, y: FloatArray, buckets: int = BUCKETS) -> tuple[FloatArray, FloatArray]:
    """Finite points of a curve, reduced to a min/max pair per bucket when there are many more than `buckets`."""
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) <= 2 * buckets:
        return x, y
    starts = np.linspace(0, len(x), buckets + 1).astype(np.int64)[:-1]
    lo = np.minimum.reduceat(y, starts)
    hi = np.maximum.reduceat(y, starts)
    ends = np.append(starts[1:], len(x)) - 1
    mid = (x[starts] + x[ends]) / 2.0
    return np.repeat(mid, 2), np.column_stack([lo, hi]).ravel()


def metric_figure(comparisons: Sequence[Comparison], metric: str, *, labels: Sequence[str]) -> Figure:
    """The figure of one metric: every log's curve above (reference wide beneath), each test's error beneath with
    the band of its first comparison shaded and the first step outside it marked; the error in band widths
    beneath when the band would not show at the error's scale."""
    pulls = [(i, c.aligned.index.to_numpy(dtype=float), pull) for i, c in enumerate(comparisons)
             if metric in c.metrics and (pull := in_band_widths(
                 c.metrics[metric].band, c.aligned.index.to_numpy(dtype=np.int64),
                 c.aligned[f"{metric}_error"].to_numpy(dtype=float))) is not None]
    fig = Figure(figsize=(11, 7.6 if pulls else 6.2), dpi=100)
    # Fixed margins: constrained layout would draw every figure twice (a third of the report's time at 100k steps).
    axes = fig.subplots(3 if pulls else 2, 1, sharex=True, gridspec_kw={
        "height_ratios": [3, 1.6, 1.2] if pulls else [3, 1.6], "hspace": 0.08})
    top, bottom = axes[0], axes[1]
    fig.subplots_adjust(left=0.1, right=0.985, top=0.92, bottom=0.08)
    ref = comparisons[0].reference.frame
    x, y = envelope(ref.index.to_numpy(dtype=float), ref[metric].to_numpy(dtype=float, na_value=np.nan))
    top.plot(x, y, color=REFERENCE_COLOR, linewidth=3.2, alpha=0.4, label=labels[-1])
    heads = []
    for i, c in enumerate(comparisons):
        if metric not in c.metrics:
            continue
        color = COLORS[i % len(COLORS)]
        steps = c.aligned.index.to_numpy(dtype=float)
        x, y = envelope(steps, c.aligned[f"{metric}_test"].to_numpy(dtype=float))
        top.plot(x, y, color=color, linewidth=1.0, label=labels[i])
        mc = c.metrics[metric]
        s = mc.stats
        if i == 0:
            _band(bottom, c, metric)
        x, y = envelope(steps, c.aligned[f"{metric}_error"].to_numpy(dtype=float))
        bottom.plot(x, y, color=color, linewidth=0.8, label=f"error {labels[i]}")
        if math.isfinite(s.get("me")):
            bottom.axhline(s.get("me"), color=color, linewidth=0.8, linestyle="--",
                           label=f"ME {fmt_stat(s.get('me'), 'me', mc.resolution, mc.magnitude)}")
        div = mc.divergence
        if div is not None and div.first_step is not None:
            for ax in (top, bottom):
                ax.axvline(div.first_step, color="#7d3c98", linewidth=0.9, linestyle=":")
        shown = {k: fmt_stat(s.get(k), k, mc.resolution, mc.magnitude) for k in ("me", "max_abs", "mean_rel")}
        heads.append(f"{labels[i]}: ME {shown['me']}, max |e| {shown['max_abs']} (step {s.step_of('max_abs')}), "
                     f"mean rel {shown['mean_rel']}"
                     + (f", first outside band: step {div.first_step}" if div and div.first_step is not None else ""))
    top.set_ylabel(metric)
    top.legend(loc="upper right", fontsize=9)
    top.grid(alpha=0.3)
    top.set_title(f"{metric} — " + "; ".join(heads), fontsize=9)
    bottom.axhline(0.0, color="black", linewidth=0.6)
    bottom.legend(loc="upper right", fontsize=7)
    # Tick labels carry their own exponent: no offset text ("1e-6") above the axis, where it hit the upper panel.
    bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "0" if v == 0 else f"{v:.2g}"))
    bottom.set_ylabel(f"test − {labels[-1]}", fontsize=9)
    bottom.grid(alpha=0.3)
    if pulls:
        pull_ax = axes[2]
        pull_ax.set_yscale("log")
        pull_ax.axhspan(PULL_FLOOR, 1.0, color="#2e86c1", alpha=0.15, linewidth=0, label="inside the band")
        for i, steps, pull in pulls:
            x, y = envelope(steps, pull)
            pull_ax.plot(x, y, color=COLORS[i % len(COLORS)], linewidth=0.8, label=f"|error {labels[i]}| / band")
        pull_ax.axhline(1.0, color="#2e86c1", linewidth=0.8)
        pull_ax.set_ylim(bottom=PULL_FLOOR)
        pull_ax.legend(loc="upper right", fontsize=7)
        pull_ax.set_ylabel("|error| / band", fontsize=9)
        pull_ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    return fig


def _band(ax: Any, c: Comparison, metric: str) -> None:
    """Shade the metric's band as the comparison computed it (the one the report's sentences read)."""
    b = c.metrics[metric].band
    if b is None:
        return
    ok = np.isfinite(b.width)
    if ok.any():
        x, w = envelope(b.steps[ok].astype(float), b.width[ok])
        ax.fill_between(x, -w, w, color="#2e86c1", alpha=0.15, linewidth=0, label=f"band: {b.basis}")


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def metric_pngs(comparisons: Sequence[Comparison], *, labels: Sequence[str]) -> dict[str, bytes]:
    """PNG bytes of every compared metric, in the comparisons' metric order."""
    metrics: list[str] = []
    for c in comparisons:
        metrics += [m for m in c.metrics if m not in metrics]
    return {m: png_bytes(metric_figure(comparisons, m, labels=labels)) for m in metrics}


def thumbnail_figure(c: Comparison, metric: str, *, labels: Sequence[str]) -> Figure:
    """A small picture of one metric (both curves, the error statistics in the title): what the Prefect run
    summary shows without a click, about 380 x 180 pixels."""
    fig = Figure(figsize=(4.8, 2.25), dpi=80)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.14, right=0.98, top=0.86, bottom=0.15)
    ref = c.reference.frame
    x, y = envelope(ref.index.to_numpy(dtype=float), ref[metric].to_numpy(dtype=float, na_value=np.nan), 400)
    ax.plot(x, y, color=REFERENCE_COLOR, linewidth=2.6, alpha=0.45, label=labels[-1])
    x, y = envelope(c.aligned.index.to_numpy(dtype=float), c.aligned[f"{metric}_test"].to_numpy(dtype=float), 400)
    ax.plot(x, y, color=COLORS[0], linewidth=1.0, label=labels[0])
    mc = c.metrics[metric]
    s = mc.stats
    ax.set_title(f"{metric}: ME {fmt_stat(s.get('me'), 'me', mc.resolution, mc.magnitude)}, max |e| "
                 f"{fmt_stat(s.get('max_abs'), 'max_abs', mc.resolution, mc.magnitude)}", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(loc="upper right", fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def thumbnail_pngs(c: Comparison, *, labels: Sequence[str]) -> dict[str, bytes]:
    """PNG bytes of the loss and grad-norm thumbnails (those of `THUMBNAIL_METRICS` the comparison has)."""
    return {m: png_bytes(thumbnail_figure(c, m, labels=labels)) for m in THUMBNAIL_METRICS if m in c.metrics}
