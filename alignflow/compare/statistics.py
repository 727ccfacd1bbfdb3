"""Per-step error statistics of one metric: the registered statistics (alignflow.config.statistics), computed with
numpy on aligned arrays.

Definitions (docs/seeds.md#error-statistics): per-step error `e = test - reference`; `me` = mean(e) (signed);
`mean_abs` = mean(|e|); `max_error` / `min_error` = the largest / smallest signed error; `max_abs` = max(|e|);
relative error `|e| / (|reference| + 1e-8)` with `mean_rel` / `max_rel` over the steps and `step_rel` at chosen
steps. Pairs where either side is missing or not finite are left out and counted (`not_compared`); NaN/inf
values are reported as sentinels by the parser, so a statistic never silently absorbs one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from alignflow.config.statistics import STATISTICS, Reduce, Statistic

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

REL_EPS = 1e-8  # the seeds' denominator floor: |t - r| / (|r| + 1e-8)


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """The statistics of `test - reference` over a set of steps: every registered one over the whole run."""

    n: int
    values: Mapping[str, float] = field(default_factory=dict)  # by statistic name; NaN without steps
    steps: Mapping[str, int] = field(default_factory=dict)  # the step of a max / min statistic's extreme

    def get(self, statistic: str) -> float:
        """The value of a named statistic (`me`, `mean_abs`, ... as in `Criterion.statistic`)."""
        return self.values.get(statistic, NAN)

    def step_of(self, statistic: str) -> int | None:
        """The step where a max / min statistic is reached (None without steps)."""
        return self.steps.get(statistic)


NAN = float("nan")
EMPTY = ErrorStats(0)
# What each kind of statistic computes from its terms: its value and, for an extreme, the index where it is.
_REDUCE: dict[Reduce, Callable[[FloatArray], tuple[float, int | None]]] = {
    "mean": lambda t: (float(t.mean()), None),
    "max": lambda t: (float(t[int(np.argmax(t))]), int(np.argmax(t))),
    "min": lambda t: (float(t[int(np.argmin(t))]), int(np.argmin(t))),
}


@dataclass(frozen=True, slots=True)
class Pairs:
    """Aligned finite pairs of one metric: steps, test values, reference values (same length, sorted by step)."""

    steps: IntArray
    test: FloatArray
    reference: FloatArray

    @classmethod
    def from_arrays(cls, steps: IntArray, test: FloatArray, reference: FloatArray) -> Pairs:
        """Keep the steps where both values are finite."""
        ok = np.isfinite(test) & np.isfinite(reference)
        return cls(steps[ok], test[ok], reference[ok])

    def without(self, steps: Iterable[int]) -> Pairs:
        drop = np.asarray(sorted(set(steps)), dtype=self.steps.dtype)
        if drop.size == 0:
            return self
        keep = ~np.isin(self.steps, drop)
        return Pairs(self.steps[keep], self.test[keep], self.reference[keep])

    @property
    def error(self) -> FloatArray:
        return self.test - self.reference

    @property
    def rel_error(self) -> FloatArray:
        return relative_error(self.test, self.reference)

    def at(self, step: int) -> tuple[float, float] | None:
        i = int(np.searchsorted(self.steps, step))
        if i < len(self.steps) and self.steps[i] == step:
            return float(self.test[i]), float(self.reference[i])
        return None


def relative_error(test: FloatArray, reference: FloatArray) -> FloatArray:
    """`|test - reference| / (|reference| + 1e-8)` element-wise (docs/seeds.md#error-statistics)."""
    out: FloatArray = np.abs(test - reference) / (np.abs(reference) + REL_EPS)
    return out


def error_statistics(pairs: Pairs) -> ErrorStats:
    """Every registered statistic over the run's steps (those at chosen steps: `values_at`) of one metric over
    the given pairs (NaN when there are none)."""
    if len(pairs.steps) == 0:
        return EMPTY
    values: dict[str, float] = {}
    steps: dict[str, int] = {}
    for stat in STATISTICS.values():
        if stat.reduce == "at_steps":
            continue
        values[stat.name], at = _REDUCE[stat.reduce](stat.terms(pairs))
        if at is not None:
            steps[stat.name] = int(pairs.steps[at])
    return ErrorStats(len(pairs.steps), values, steps)


def values_at(pairs: Pairs, stat: Statistic, steps: Iterable[int]) -> dict[int, float]:
    """`stat`'s term at each requested step; NaN for a step that is not compared on both sides."""
    terms = stat.terms(pairs)
    out: dict[int, float] = {}
    for step in steps:
        i = int(np.searchsorted(pairs.steps, step))
        out[step] = float(terms[i]) if i < len(pairs.steps) and pairs.steps[i] == step else NAN
    return out


@dataclass(frozen=True, slots=True)
class Perplexity:
    """exp(loss) of both sides: over the mean loss of the compared steps and at the last compared step."""

    test: float
    reference: float
    rel_error: float
    test_final: float
    reference_final: float

    def to_json(self) -> dict[str, float | None]:
        return {k: finite_or_none(getattr(self, k)) for k in self.__slots__}


def perplexity(pairs: Pairs) -> Perplexity | None:
    """Perplexity of a cross-entropy metric (None without compared steps)."""
    if len(pairs.steps) == 0:
        return None
    with np.errstate(over="ignore"):
        pt = float(np.exp(pairs.test.mean()))
        pr = float(np.exp(pairs.reference.mean()))
        ft = float(np.exp(pairs.test[-1]))
        fr = float(np.exp(pairs.reference[-1]))
    rel = (pt - pr) / pr if math.isfinite(pr) and pr != 0 else NAN
    return Perplexity(pt, pr, rel, ft, fr)


def paired(test_steps: IntArray, test: FloatArray, ref_steps: IntArray, reference: FloatArray,
           shift: int = 0) -> Pairs:
    """Pair test[s] with reference[s + shift] over the test's steps; both step arrays sorted."""
    return Pairs.from_arrays(test_steps, test, _lookup(ref_steps, reference, test_steps + shift))


def best_shift(test_steps: IntArray, test: FloatArray, ref_steps: IntArray, reference: FloatArray,
               tolerance: int) -> tuple[int, Pairs]:
    """The step shift k in [-tolerance, tolerance] that pairs test[s] with reference[s + k] best (least mean |e|).

    Why: MindFormers PyNative prints the learning rate of the *next* step (the scheduler is evaluated after the
    step counter moved, docs/mindformers.md#step-numbering-and-the-printed-learning-rate), Megatron the one it used. One
    shift for the whole run, not
    a per-step choice, so a real schedule difference is not explained away. Ties keep the smaller |k| (0 first).
    """
    best: tuple[float, int, Pairs] | None = None
    for k in sorted(range(-tolerance, tolerance + 1), key=lambda x: (abs(x), x)):
        pairs = paired(test_steps, test, ref_steps, reference, k)
        if len(pairs.steps) == 0:
            continue
        score = float(np.abs(pairs.error).mean())
        if best is None or score < best[0]:
            best = (score, k, pairs)
    if best is None:
        return 0, paired(test_steps, test, ref_steps, reference)
    return best[1], best[2]


def _lookup(ref_steps: IntArray, ref_values: FloatArray, wanted: IntArray) -> FloatArray:
    """Reference values at `wanted` steps (NaN where the reference has no such step); `ref_steps` is sorted."""
    out: FloatArray = np.full(len(wanted), np.nan)
    if len(ref_steps) == 0:
        return out
    idx = np.minimum(np.searchsorted(ref_steps, wanted), len(ref_steps) - 1)
    found = ref_steps[idx] == wanted
    out[found] = ref_values[idx[found]]
    return out


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN: a missing or non-finite statistic is null."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)
