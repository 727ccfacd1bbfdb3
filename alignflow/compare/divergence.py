"""The curve level of a comparison (issue 21, item 1): where the error first leaves its band, and which steps
drive each failed criterion.

The band of a metric at step s is the widest of:

- the criterion's threshold as a per-step bound: `|e_s| <= t` for an absolute statistic, `|e_s| <= t * (|r_s| +
  1e-8)` for a relative one (the tightest of the metric's criteria that judge step s; `step_rel` judges its
  steps only, `exclude_steps` are judged by none of that criterion);
- the printed resolution: one unit of the coarser log's last printed digit at |r_s| (two printed values that
  are both rounded can differ by up to one unit without any real difference);
- the measured noise floor of the metric, when there is one (`noise_floor`, absolute per-step error of the
  reference side against itself; `alignflow noise` measures it).

Every compared metric has a band, criterion or not (issue 40: a report that says "every metric stays inside its
band" must not draw a metric's error outside it). A metric without a criterion of its own is held to:

- lm_loss's criteria, when it is a cross-entropy loss like lm_loss (`mtp_<k>_loss`): the same quantity in the same
  unit, which the seeds judge by the same thresholds (docs/seeds.md#qwen35-criteria-relative-error: "the same two
  relative criteria" for the MTP loss);
- else the printed resolution and the noise floor: all the logs say of how far two values may differ (lr printed
  to 7 digits on both sides should agree to 7 digits).

The band is computed once per metric by `compare` (kept on `MetricComparison.band`); the report's sentences, its
tables and both kinds of figure read that one band. `Band.basis` says what it was made of. Pure numpy over `Pairs`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from alignflow.compare.statistics import REL_EPS, FloatArray, IntArray, Pairs, finite_or_none
from alignflow.config.criteria import Criterion
from alignflow.config.statistics import STATISTICS, Reduce
from alignflow.logs.schema import Resolution, is_cross_entropy

TOP_DRIVERS = 5
LM_LOSS = "lm_loss"  # the loss whose criteria a cross-entropy metric without its own is held to


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where the error of one metric first leaves its band (None: it never does)."""

    metric: str
    first_step: int | None
    steps_outside: int
    worst_step: int | None  # largest |e| / band
    criterion: str | None  # label of the criterion whose threshold is the band at the first step (None: floor)
    band_at_first: float | None
    error_at_first: float | None
    noise_floor: float | None
    basis: str = ""  # what the band is made of (`Band.basis`)
    judged_steps: int = 0  # compared steps the band bounds (0: the metric has no band, nothing can be said)
    own_criteria: bool = True  # False: no criterion of its own judges the metric (the verdict does not read it)

    @property
    def inside(self) -> bool:
        """Judged at some step, and inside the band at every one."""
        return self.first_step is None and self.judged_steps > 0

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "first_step": self.first_step, "steps_outside": self.steps_outside,
                "worst_step": self.worst_step, "criterion": self.criterion,
                "band_at_first": finite_or_none(self.band_at_first),
                "error_at_first": finite_or_none(self.error_at_first), "noise_floor": finite_or_none(self.noise_floor),
                "basis": self.basis, "judged_steps": self.judged_steps, "own_criteria": self.own_criteria}


@dataclass(frozen=True, slots=True)
class Driver:
    """One step's share in a statistic: its error and what it adds to the statistic (same unit as the value)."""

    step: int
    error: float  # e_s = test - reference at the step
    contribution: float  # e_s / n for me, |e_s| / n for mean_abs, rel_s / n for mean_rel, the value for max/step

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "error": finite_or_none(self.error),
                "contribution": finite_or_none(self.contribution)}


@dataclass(frozen=True, slots=True)
class Band:
    """The per-step band of one metric over its compared steps."""

    steps: IntArray
    width: FloatArray  # half-width, in the metric's unit (inf where nothing bounds the error)
    source: tuple[str | None, ...]  # per step: label of the criterion that sets it, None for resolution/noise
    basis: str = ""  # what it is made of: "its criteria and the printed resolution", ...
    own_criteria: bool = True  # False: borrowed (lm_loss's criteria) or no criterion at all


# A band narrower than this share of the largest |error| is a few pixels tall on an axis scaled to the error: the
# figures then add |error| in band widths beneath, on a log axis where the band's edge is the line at 1 whether the
# error is 2 or 2,000 band widths (a linear pull panel would hide the band again at 500).
BAND_VISIBLE_SHARE = 0.05
PULL_FLOOR = 1e-3  # |error| / band below this (an exact match among them) is drawn at it: a log axis has no 0


def in_band_widths(b: Band | None, steps: IntArray, error: FloatArray) -> FloatArray | None:
    """`|error| / band half-width` at `steps` (at least PULL_FLOOR; NaN where no finite band bounds it), or None when
    the band is visible at the error's own scale (at least BAND_VISIBLE_SHARE of the largest |error|) or there is
    none: a failing curve whose error dwarfs its band still shows where the band is, as 1 (issue 47)."""
    if b is None or not len(b.steps):
        return None
    width = np.full(len(steps), np.nan)
    at = np.searchsorted(steps, b.steps)
    inside = (at < len(steps)) & (steps[np.minimum(at, len(steps) - 1)] == b.steps)
    width[at[inside]] = np.where(np.isfinite(b.width[inside]) & (b.width[inside] > 0), b.width[inside], np.nan)
    finite_error = np.abs(error[np.isfinite(error)])
    if not np.isfinite(width).any() or not finite_error.size:
        return None
    if np.nanmax(width) >= BAND_VISIBLE_SHARE * finite_error.max():
        return None
    with np.errstate(invalid="ignore"):
        out: FloatArray = np.where(np.isfinite(error) & np.isfinite(width),
                                   np.maximum(np.abs(error) / width, PULL_FLOOR), np.nan)
    return out


def per_step_quantum(t: Resolution | None, r: Resolution | None, reference: FloatArray) -> FloatArray:
    """One unit of the coarser side's last printed digit at each step's reference magnitude (0 when unknown)."""
    out: FloatArray = np.zeros(len(reference))
    mags = np.abs(reference)
    for res in (t, r):
        if res is None:
            continue
        if res.kind == "decimals":
            q = np.full(len(reference), 10.0 ** -res.digits)
        else:
            with np.errstate(divide="ignore"):
                q = np.where(mags > 0, 10.0 ** (np.floor(np.log10(np.where(mags > 0, mags, 1.0))) - res.digits), 0.0)
        out = np.maximum(out, q)
    return out


def criterion_width(c: Criterion, pairs: Pairs) -> FloatArray:
    """The per-step bound criterion `c` puts on |e| at each of `pairs`' steps (inf where it judges no step)."""
    if STATISTICS[c.statistic].relative:
        width: FloatArray = c.threshold * (np.abs(pairs.reference) + REL_EPS)
    else:
        width = np.full(len(pairs.steps), c.threshold)
    judged = np.ones(len(pairs.steps), dtype=bool)
    if c.at_steps:
        judged = np.isin(pairs.steps, np.asarray(c.steps or [1]))
    if c.exclude_steps:
        judged &= ~np.isin(pairs.steps, np.asarray(c.exclude_steps))
    out: FloatArray = np.where(judged, width, np.inf)
    return out


def band_criteria(metric: str, criteria: Sequence[Criterion]) -> tuple[list[Criterion], bool]:
    """The criteria that bound `metric`'s per-step error, and whether they are its own (see the module docstring)."""
    # a threshold still written as 'Nx noise' with no measured noise (NaN) bounds no step: the criterion fails, and
    # the metric's band is what is left
    mine = [c for c in criteria if c.metric == metric and math.isfinite(c.threshold)]
    if mine or metric == LM_LOSS or not is_cross_entropy(metric):
        return mine, True
    return [c for c in criteria if c.metric == LM_LOSS and math.isfinite(c.threshold)], False


def band(metric: str, pairs: Pairs, criteria: Sequence[Criterion], t: Resolution | None, r: Resolution | None,
         noise_floor: float | None = None) -> Band:
    """The band of `metric` at each compared step (see the module docstring)."""
    n = len(pairs.steps)
    mine, own = band_criteria(metric, criteria)
    width: FloatArray = np.full(n, np.inf)
    owner = np.full(n, -1)
    for i, c in enumerate(mine):
        w = criterion_width(c, pairs)
        tighter = w < width
        width = np.where(tighter, w, width)
        owner = np.where(tighter, i, owner)
    floor = per_step_quantum(t, r, pairs.reference)
    if noise_floor is not None and math.isfinite(noise_floor):
        floor = np.maximum(floor, noise_floor)
    judged = np.isfinite(width)
    # A step no criterion judges (step 2 excluded as Adam's transient) is judged by none; a metric without
    # criteria has its floor as band, when it has one.
    unjudged = np.full(n, np.inf) if mine else np.where(floor > 0, floor, np.inf)
    final: FloatArray = np.where(judged, np.maximum(width, floor), unjudged)
    owner = np.where(judged & (width >= floor), owner, -1)
    names: list[str | None] = [c.label for c in mine]
    labels = tuple(names[o] if o >= 0 else None for o in owner.tolist())
    return Band(pairs.steps, final, labels, _basis(metric, mine, own, floor, noise_floor), own and bool(mine))


def _basis(metric: str, mine: Sequence[Criterion], own: bool, floor: FloatArray, noise: float | None) -> str:
    """`its criteria and the printed resolution`, `lm_loss's criteria (no criterion of its own) and ...`."""
    parts = []
    if mine:
        parts.append("its criteria" if own else f"{LM_LOSS}'s criteria (no criterion of its own)")
    if (floor > 0).any():
        parts.append("the measured noise floor" if noise is not None and math.isfinite(noise)
                     else "the printed resolution")
    if not parts:
        return "no criterion, printed resolution unknown"
    text = " and ".join(parts)
    return text if mine else f"{text} (no criterion)"


def divergence(metric: str, pairs: Pairs, b: Band, noise_floor: float | None = None) -> Divergence:
    """The first compared step whose |error| exceeds the band, how many do, and the worst one.

    |error| is taken less the float64 rounding of the subtraction itself (a few ulps of the operands): two printed
    values one unit apart (1.000001 - 1.000000) subtract to 1.0000000001e-06, which is one unit, not more.
    """
    ulps = 4 * np.finfo(np.float64).eps * (np.abs(pairs.test) + np.abs(pairs.reference))
    err = np.maximum(np.abs(pairs.error) - ulps, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isinf(b.width), 0.0, err / np.where(b.width > 0, b.width, np.nan))
    ratio = np.where(np.isnan(ratio), np.where(err > 0, np.inf, 0.0), ratio)
    outside = ratio > 1.0
    judged = int(np.isfinite(b.width).sum())
    if not outside.any():
        return Divergence(metric, None, 0, None, None, None, None, noise_floor, b.basis, judged, b.own_criteria)
    i = int(np.argmax(outside))
    worst = int(np.argmax(ratio))
    return Divergence(metric, int(pairs.steps[i]), int(outside.sum()), int(pairs.steps[worst]), b.source[i],
                      float(b.width[i]), float(pairs.error[i]), noise_floor, b.basis, judged, b.own_criteria)


def drivers(c: Criterion, pairs: Pairs, value: float, top: int = TOP_DRIVERS) -> tuple[Driver, ...]:
    """The steps that contribute most to criterion `c`'s value over `pairs` (already without excluded steps).

    Averages (me, mean_abs, mean_rel): the steps whose terms add most to the sum in the direction of the value;
    extremes (max_*, min_error): the extreme step first, then the next ones beyond the threshold; step_rel: its
    steps, worst first.
    """
    n = len(pairs.steps)
    if n == 0 or not math.isfinite(value):
        return ()
    stat = STATISTICS[c.statistic]
    term, order_by = _SHARE[stat.reduce](stat.terms(pairs), n, value)
    if c.at_steps:
        order_by = np.where(np.isin(pairs.steps, np.asarray(c.steps or [1])), order_by, -np.inf)
    ranked = np.argsort(-order_by, kind="stable")[:top]
    err = pairs.error
    return tuple(Driver(int(pairs.steps[i]), float(err[i]), float(term[i])) for i in ranked
                 if np.isfinite(order_by[i]) and order_by[i] > 0)


def _mean_share(terms: FloatArray, n: int, value: float) -> tuple[FloatArray, FloatArray]:
    share: FloatArray = terms / n
    return share, share * (1.0 if value >= 0 else -1.0)  # the terms that pull the mean the way it went


# Each kind of statistic: (its terms, n, its value) -> what each step adds to the value, and what ranks the steps.
_SHARE: dict[Reduce, Callable[[FloatArray, int, float], tuple[FloatArray, FloatArray]]] = {
    "mean": _mean_share,
    "max": lambda terms, n, value: (terms, terms),
    "min": lambda terms, n, value: (terms, -terms),
    "at_steps": lambda terms, n, value: (terms, terms),
}


def curve_level(
    pairs: Mapping[str, Pairs], criteria: Sequence[Criterion], resolutions: Mapping[str, tuple[Resolution | None,
                                                                                                 Resolution | None]],
    noise_floor: Mapping[str, float] | None = None,
) -> dict[str, tuple[Band, Divergence]]:
    """The band of every compared metric, and where its error first leaves it."""
    out: dict[str, tuple[Band, Divergence]] = {}
    for metric, p in pairs.items():
        t, r = resolutions.get(metric, (None, None))
        floor = (noise_floor or {}).get(metric)
        b = band(metric, p, criteria, t, r, floor)
        out[metric] = (b, divergence(metric, p, b, floor))
    return out


def criterion_first_outside(c: Criterion, pairs: Pairs, t: Resolution | None, r: Resolution | None,
                            noise_floor: float | None = None) -> int | None:
    """The first step that leaves criterion `c`'s own band (its threshold, floored by resolution and noise)."""
    b = band(c.metric, pairs, [c], t, r, noise_floor)
    judged = np.isfinite(criterion_width(c, pairs))
    if not judged.any():
        return None
    sub = Pairs(pairs.steps[judged], pairs.test[judged], pairs.reference[judged])
    return divergence(c.metric, sub, Band(b.steps[judged], b.width[judged],
                                          tuple(s for s, j in zip(b.source, judged, strict=True) if j))).first_step
