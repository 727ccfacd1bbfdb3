"""PNG plots of a comparison: both curves of a metric above, the signed error (test - reference) beneath.

matplotlib's object API on the Agg canvas (no pyplot state, no display), so plotting is safe in a worker thread
and in CI. Long runs are drawn through a min/max envelope per horizontal bucket: a 100,000-step curve becomes
~4,000 vertices that draw exactly the same picture at the figure's resolution, instead of 100,000 that cost
seconds per figure.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np
from matplotlib.figure import Figure

from alignflow.compare.comparison import Comparison
from alignflow.compare.statistics import FloatArray

BUCKETS = 2000  # envelope buckets per curve: about the figure's width in pixels
COLORS = ("#c0392b", "#1e8449")  # test red, reference green (the seeds' NPU-red / GPU-green convention)


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


def metric_figure(comparison: Comparison, metric: str, *, labels: tuple[str, str]) -> Figure:
    """The figure of one compared metric."""
    aligned = comparison.aligned
    steps = aligned.index.to_numpy(dtype=float)
    stats = comparison.metrics[metric]
    fig = Figure(figsize=(11, 6.2), dpi=100)
    # Fixed margins: constrained layout would draw every figure twice (a third of the report's time at 100k steps).
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.6], "hspace": 0.06})
    fig.subplots_adjust(left=0.09, right=0.985, top=0.92, bottom=0.08)
    for column, label, color in ((f"{metric}_test", labels[0], COLORS[0]),
                                 (f"{metric}_reference", labels[1], COLORS[1])):
        x, y = envelope(steps, aligned[column].to_numpy(dtype=float))
        top.plot(x, y, color=color, linewidth=1.0, label=label, alpha=0.85)
    top.set_ylabel(metric)
    top.legend(loc="upper right", fontsize=9)
    top.grid(alpha=0.3)
    s = stats.stats
    max_abs = f"{s.max_abs:.3g}" if math.isfinite(s.max_abs) else "n/a"
    head = f"{metric}: ME {_g(s.me)}, max |e| {max_abs} (step {s.max_abs_step}), mean rel {_pct(s.mean_rel)}"
    if stats.shift:
        head += f", reference shifted by {stats.shift:+d} step"
    top.set_title(head, fontsize=10)
    x, y = envelope(steps, aligned[f"{metric}_error"].to_numpy(dtype=float))
    bottom.plot(x, y, color="#34495e", linewidth=0.8)
    bottom.axhline(0.0, color="black", linewidth=0.6)
    if math.isfinite(s.me):
        bottom.axhline(s.me, color="#e67e22", linewidth=0.8, linestyle="--", label=f"ME {_g(s.me)}")
        bottom.legend(loc="upper right", fontsize=8)
    bottom.set_ylabel(f"{labels[0]} - {labels[1]}", fontsize=9)
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def metric_pngs(comparison: Comparison, *, labels: tuple[str, str]) -> dict[str, bytes]:
    """PNG bytes of every compared metric, in the comparison's metric order."""
    return {m: png_bytes(metric_figure(comparison, m, labels=labels)) for m in comparison.metrics}


def png_name(metric: str) -> str:
    return "plot_" + re.sub(r"[^A-Za-z0-9_.-]", "_", metric) + ".png"


def _g(value: float) -> str:
    return f"{value:+.3g}" if math.isfinite(value) else "n/a"


def _pct(value: float) -> str:
    return f"{value * 100:.3g}%" if math.isfinite(value) else "n/a"

