"""The statistics a criterion may name: one registry (`STATISTICS`), one `Statistic` per name.

Definitions (docs/seeds.md#error-statistics): per-step error `e = test - reference`, relative error
`|e| / (|reference| + 1e-8)`. A statistic is its per-step terms and how they reduce to one value: their mean, their
largest or smallest value, or their largest at chosen steps (`step_rel`). Everything else follows from that entry:
the value (alignflow.compare.statistics), the steps that drive a failed criterion and the band it puts on each step
(alignflow.compare.divergence), its cell in the tables and its notation (alignflow.compare.tables, formatting) and
the names `Criterion.statistic` accepts. A new statistic is one `register` call here
(docs/architecture.md#where-code-goes).

Here, under alignflow.config, because criteria files are validated against it; the terms are methods of the numpy
arrays they are given, so reading a config imports no numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

Reduce = Literal["mean", "max", "min", "at_steps"]


class Errors(Protocol):
    """What a statistic's terms are read from: the compared steps' errors (`alignflow.compare.statistics.Pairs`)."""

    @property
    def error(self) -> FloatArray: ...

    @property
    def rel_error(self) -> FloatArray: ...


@dataclass(frozen=True, slots=True)
class Statistic:
    """One statistic of the per-step error: its terms, how they reduce, and how it reads."""

    name: str
    heading: str  # its column in the metrics table
    terms: Callable[[Errors], FloatArray]  # one term per compared step
    reduce: Reduce  # mean | max | min of the terms, or their max at the criterion's steps (step 1 by default)
    relative: bool = False  # a fraction of the reference: shown in %, its band scales with |reference|
    signed: bool = False  # shown with its sign
    shows_step: bool = False  # the metrics table and JSON name the step of the extreme (`<name>_step`)
    description: str = ""


STATISTICS: dict[str, Statistic] = {}
"""The registry, by name, in the order the metrics table shows the statistics."""


def register(stat: Statistic) -> Statistic:
    if stat.name in STATISTICS:
        raise ValueError(f"statistic {stat.name!r} is already registered")
    STATISTICS[stat.name] = stat
    return stat


def statistic(name: str) -> Statistic:
    """The registered statistic `name`; `ValueError` naming the registered ones."""
    try:
        return STATISTICS[name]
    except KeyError:
        raise ValueError(f"unknown statistic {name!r}; registered: {', '.join(STATISTICS)}") from None


def is_relative(name: str) -> bool:
    """Whether statistic `name` is relative (a registered name; any other reads as absolute)."""
    stat = STATISTICS.get(name)
    return stat is not None and stat.relative


def is_averaged(name: str) -> bool:
    """Whether statistic `name` is a mean over the steps (shown with one digit more than a printed value)."""
    stat = STATISTICS.get(name)
    return stat is not None and stat.reduce == "mean"


def _error(e: Errors) -> FloatArray:
    return e.error


def _abs(e: Errors) -> FloatArray:
    return abs(e.error)


def _rel(e: Errors) -> FloatArray:
    return e.rel_error


for _stat in (
    Statistic("me", "ME", _error, "mean", signed=True, description="mean error (signed)"),
    Statistic("mean_abs", "mean |e|", _abs, "mean", description="mean absolute error"),
    Statistic("max_error", "max e", _error, "max", signed=True, description="largest signed error"),
    Statistic("min_error", "min e", _error, "min", signed=True, description="smallest signed error"),
    Statistic("max_abs", "max |e|", _abs, "max", shows_step=True, description="largest absolute error"),
    Statistic("step_rel", "step rel", _rel, "at_steps", relative=True, description="relative error at given steps"),
    Statistic("mean_rel", "mean rel", _rel, "mean", relative=True, description="mean relative error"),
    Statistic("max_rel", "max rel", _rel, "max", relative=True, shows_step=True,
              description="largest relative error"),
):
    register(_stat)
