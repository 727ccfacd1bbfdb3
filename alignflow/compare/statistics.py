"""Per-step error statistics of one metric: the seeds' definitions, computed with numpy on aligned arrays.

Definitions (docs/seeds.md#error-statistics): per-step error `e = test - reference`; `me` = mean(e) (signed);
`mean_abs` = mean(|e|); `max_error` / `min_error` = the largest / smallest signed error; `max_abs` = max(|e|);
relative error `|e| / (|reference| + 1e-8)` with `mean_rel` / `max_rel` over the steps and `step_rel` at chosen
steps. Pairs where either side is missing or not finite are left out and counted (`not_compared`); NaN/inf
values are reported as sentinels by the parser, so a statistic never silently absorbs one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

REL_EPS = 1e-8  # the seeds' denominator floor: |t - r| / (|r| + 1e-8)


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """The statistics of `test - reference` over a set of steps."""

    n: int
    me: float
    mean_abs: float
    max_error: float
    min_error: float
    max_abs: float
    mean_rel: float
    max_rel: float
    max_abs_step: int | None
    max_rel_step: int | None

    def get(self, statistic: str) -> float:
        """The value of a named statistic (`me`, `mean_abs`, ... as in `Criterion.statistic`)."""
        value = getattr(self, statistic)
        assert isinstance(value, float), statistic
        return value


NAN = float("nan")
EMPTY = ErrorStats(0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, None, None)


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
    """All the seeds' statistics of one metric over the given pairs (NaN when there are none)."""
    n = len(pairs.steps)
    if n == 0:
        return EMPTY
    err = pairs.error
    abs_err = np.abs(err)
    rel = pairs.rel_error
    i_abs = int(np.argmax(abs_err))
    i_rel = int(np.argmax(rel))
    return ErrorStats(
        n=n, me=float(err.mean()), mean_abs=float(abs_err.mean()), max_error=float(err.max()),
        min_error=float(err.min()), max_abs=float(abs_err[i_abs]), mean_rel=float(rel.mean()),
        max_rel=float(rel[i_rel]), max_abs_step=int(pairs.steps[i_abs]), max_rel_step=int(pairs.steps[i_rel]),
    )


def step_relative_errors(pairs: Pairs, steps: Iterable[int]) -> dict[int, float]:
    """Relative error at each requested step; NaN for a step that is not compared on both sides."""
    out: dict[int, float] = {}
    for step in steps:
        pair = pairs.at(step)
        out[step] = NAN if pair is None else float(relative_error(np.array([pair[0]]), np.array([pair[1]]))[0])
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
