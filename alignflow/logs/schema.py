"""The canonical shape of a parsed training log: column names, printed resolution, sentinels, the result type.

Both frameworks' parsers normalise to one schema so that everything downstream (comparison, report, store)
speaks one language: `lm_loss` is the language-model cross entropy on both sides (MindFormers PyNative `loss`,
legacy `lm_loss`, Megatron `lm loss`), `mtp_<k>_loss` the raw depth-k MTP loss, `grad_norm` the pre-clip
global norm, `lr` the printed learning rate (docs/mindformers.md#what-each-logged-number-means,
docs/megatron.md#loss-semantics).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import pandas as pd

# What to do with Megatron's first printed interval (alignflow.logs.first_interval): decide from the log's evidence,
# always undo the averaging, or leave every value as printed.
FirstIntervalChoice = Literal["auto", "deaverage", "raw"]
FIRST_INTERVAL_CHOICES: tuple[str, ...] = ("auto", "deaverage", "raw")

# Columns in the order a table shows them; anything else a log prints follows, sorted.
LEADING_COLUMNS: tuple[str, ...] = ("lm_loss",)
TRAILING_COLUMNS: tuple[str, ...] = (
    "total_loss", "mtp_loss_scaled_sum", "grad_norm", "lr", "params_norm", "loss_scale", "step_time_ms",
    "throughput_tflops", "consumed_samples", "global_batch_size", "skipped", "nan_iterations", "overflow",
)
# Columns that describe the run's bookkeeping or speed, not its numerics: never compared as an error metric.
BOOKKEEPING_COLUMNS: frozenset[str] = frozenset({
    "step_time_ms", "throughput_tflops", "consumed_samples", "skipped_samples", "global_batch_size", "skipped",
    "nan_iterations", "overflow", "loss_scale", "num_zeros", "energy_j_per_iter", "power_w", "max_steps",
    # Megatron-DeepSpeed, ms-swift and NeMo 2 speed / progress fields
    "consumed_tokens", "actual_seqlen", "curriculum_seqlen", "random_ltd_reserved_length", "samples_per_second",
    "tokens_per_gpu_per_second", "memory_gib", "global_step", "max_memory_reserved", "max_memory_allocated",
})
# Integer-valued columns (nullable Int64 in the frame, ints in JSON).
INTEGER_COLUMNS: frozenset[str] = frozenset({
    "consumed_samples", "skipped_samples", "global_batch_size", "skipped", "nan_iterations", "num_zeros",
    "consumed_tokens", "actual_seqlen", "curriculum_seqlen", "global_step",
})
# Cross-entropy losses: perplexity = exp(loss) is meaningful for these (aux losses are not log-likelihoods).
_CE_LOSS = re.compile(r"^(?:lm_loss|mtp_\d+_loss)$")


def is_cross_entropy(column: str) -> bool:
    """True for language-model cross-entropy columns (`lm_loss`, `mtp_<k>_loss`)."""
    return _CE_LOSS.match(column) is not None


def is_loss(column: str) -> bool:
    """True for every loss column (a NaN or inf in one of them invalidates the step); `loss` is the plain loss
    key some Megatron-based trainers print instead of `lm loss` (ms-swift's RLHF trainers)."""
    return column.endswith("_loss") or column in ("loss", "mtp_loss_scaled_sum")


def column_order(columns: list[str]) -> list[str]:
    """Canonical display order: lm_loss, mtp_k_loss by k, other losses, then the fixed trailing columns."""

    def key(col: str) -> tuple[int, int, str]:
        if col in LEADING_COLUMNS:
            return (0, LEADING_COLUMNS.index(col), col)
        mtp = re.match(r"^mtp_(\d+)_loss$", col)
        if mtp:
            return (1, int(mtp.group(1)), col)
        if col in TRAILING_COLUMNS:
            return (3, TRAILING_COLUMNS.index(col), col)
        if is_loss(col):
            return (2, 0, col)
        return (4, 0, col)

    return sorted(columns, key=key)


@dataclass(frozen=True, slots=True)
class Resolution:
    """How finely a column is printed: a fixed number of decimals, or of mantissa digits in scientific notation.

    Why: Megatron prints `grad norm` with 3 decimals while MindFormers prints 6; a per-step error below the
    coarser side's last printed digit is noise the log cannot resolve, and a criterion tighter than that cannot
    be judged honestly (STYLE: "keep the printed resolution").
    """

    kind: Literal["decimals", "significant"]
    digits: int  # decimals after the point; for "significant", decimals of the mantissa (.6E -> 6)

    def quantum(self, magnitude: float) -> float:
        """The value of one unit in the last printed digit, for a value of about `magnitude`."""
        if self.kind == "decimals":
            return 10.0 ** -self.digits
        mag = abs(magnitude)
        if not math.isfinite(mag) or mag == 0.0:
            return 0.0
        return 10.0 ** (math.floor(math.log10(mag)) - self.digits)

    def coarser(self, other: Resolution | None) -> Resolution:
        """The coarser of two resolutions of the same kind (fewer digits)."""
        if other is None or other.kind != self.kind:
            return self
        return self if self.digits <= other.digits else other

    def describe(self) -> str:
        if self.kind == "decimals":
            return f"{self.digits} decimal{'s' if self.digits != 1 else ''}"
        return f"{self.digits + 1} significant digits"

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "digits": self.digits}


@dataclass(frozen=True, slots=True)
class Sentinel:
    """A log line that makes a run suspicious (`fatal=False`) or invalid even though it exited 0 (`fatal=True`)."""

    line_no: int
    text: str
    kind: str
    fatal: bool
    message: str = ""
    rank: int | None = None
    # Steps whose values this sentinel takes out of every statistic (a skipped step printing `loss: 0.000`).
    exclude_steps: tuple[int, ...] = ()
    # A requirement (`check_sentinels(require=...)`, `--require`) under which a non-fatal sentinel is fatal:
    # "will not load any checkpoints" is how a from-scratch run starts, and fatal only when a checkpoint is required.
    fatal_when: str | None = None

    def fatal_under(self, require: Collection[str]) -> bool:
        """Whether this sentinel invalidates the run when the caller requires `require`."""
        return self.fatal or (self.fatal_when is not None and self.fatal_when in require)

    def to_json(self) -> dict[str, object]:
        return {"line": self.line_no, "kind": self.kind, "fatal": self.fatal, "message": self.message,
                "text": self.text, "rank": self.rank, "exclude_steps": list(self.exclude_steps),
                "fatal_when": self.fatal_when}

    def describe(self, source: str = "") -> str:
        where = f"{source}:{self.line_no}" if source else f"line {self.line_no}"
        rank = f" (rank {self.rank})" if self.rank is not None else ""
        return f"{where}{rank}: {self.kind}: {self.message} | {self.text}"


@dataclass(frozen=True, slots=True)
class Restart:
    """The step counter went backwards: the run was restarted (or two runs were appended to one file)."""

    line_no: int
    from_step: int
    to_step: int


@dataclass(frozen=True, slots=True)
class FirstInterval:
    """What the parse did with the first printed interval of one Megatron process (one run, or one resume).

    `step` is the line Megatron >= 0.16 averages over the process's first iterations `first_step..step`;
    `corrected` says whether its values were replaced by the per-iteration values of `first_step+1..step`.
    `columns` lists what was recomputed (averaged losses, and the skipped/nan counters when iteration
    `first_step` had counted one); `kept` the averaged columns that could not be recomputed. A recomputed loss
    combines two printed values, so its rounding error can reach `error_factor` times that of a printed one
    (3 for `2*line_2 - line_1`): the resolution of those cells is coarser than the column's `resolution`.
    """

    first_step: int
    first_line: int | None  # None when the process's first iteration has no line in the log
    step: int
    line: int
    corrected: bool
    reason: str
    columns: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    error_factor: float = 1.0

    def describe(self) -> str:
        if self.corrected and self.columns:
            factor = f"; rounding error up to {self.error_factor:.3g}x the printed one" if self.error_factor > 1 else ""
            kept = f"; left averaged: {', '.join(self.kept)}" if self.kept else ""
            return (f"step {self.step} de-averaged with step {self.first_step}'s line ({', '.join(self.columns)}"
                    f"{factor}{kept}): {self.reason}")
        return f"step {self.step} as printed: {self.reason}"

    def to_json(self) -> dict[str, object]:
        return {"first_step": self.first_step, "first_line": self.first_line, "step": self.step, "line": self.line,
                "corrected": self.corrected, "reason": self.reason, "columns": list(self.columns),
                "kept": list(self.kept), "error_factor": self.error_factor}


@dataclass(frozen=True, slots=True)
class FirstIntervalNote:
    """Megatron's first-interval averaging in one log: the mode asked for and each process's outcome."""

    mode: FirstIntervalChoice
    intervals: tuple[FirstInterval, ...] = ()

    @property
    def corrected(self) -> tuple[FirstInterval, ...]:
        return tuple(i for i in self.intervals if i.corrected and i.columns)

    @property
    def corrected_steps(self) -> tuple[int, ...]:
        return tuple(i.step for i in self.corrected)

    def corrected_cells(self, column: str) -> dict[int, float]:
        """Steps whose `column` was recomputed, with the rounding-error factor of each."""
        return {i.step: i.error_factor for i in self.corrected if column in i.columns}

    def describe(self, limit: int = 5) -> str:
        """One line: what was done at each process start (the first `limit`, then a count)."""
        if not self.intervals:
            return f"first interval ({self.mode}): no process printed a second line"
        parts = [i.describe() for i in self.intervals[:limit]]
        if len(self.intervals) > limit:
            parts.append(f"and {len(self.intervals) - limit} more process start(s)")
        return f"first interval ({self.mode}): " + "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "corrected_steps": list(self.corrected_steps),
                "intervals": [i.to_json() for i in self.intervals]}


@dataclass(frozen=True, slots=True, eq=False)
class ParsedLog:
    """One training log, parsed: a frame indexed by step with canonical columns, plus what the parse found.

    `frame` holds one row per step (the last occurrence when a restarted run repeats steps; `repeated_steps`
    lists those steps and `restarts` where the counter went back). `line_numbers` maps each kept step to its
    1-based line in the input. `resolution` gives each numeric column's printed resolution. `sentinels` holds
    every suspicious or invalidating line found, fatal or not; `markers` the first line of expected events
    (e.g. `checkpoint_loaded`) so that a caller can require them. `first_interval` (Megatron logs only) says
    which steps' values were de-averaged from Megatron's first printed interval, and why others were not.
    """

    frame: pd.DataFrame
    fmt: str  # the registered log format that read it (alignflow.logs.formats), or "declared"
    variant: str
    resolution: dict[str, Resolution]
    sentinels: tuple[Sentinel, ...]
    repeated_steps: tuple[int, ...]
    restarts: tuple[Restart, ...]
    line_numbers: pd.Series
    source: str = ""
    rank: int | None = None
    ranks: tuple[int, ...] = ()
    max_steps: int | None = None
    markers: dict[str, int] = field(default_factory=dict)
    lines_read: int = 0
    first_interval: FirstIntervalNote | None = None
    gaps: tuple[tuple[int, int], ...] = ()  # (first, last) of each run of steps missing inside the log

    @property
    def excluded_steps(self) -> dict[int, str]:
        """Steps left out of every statistic, each with the sentinel kind that excluded it."""
        return {step: s.kind for s in self.sentinels for step in s.exclude_steps}

    @property
    def steps(self) -> list[int]:
        return [int(s) for s in self.frame.index]

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns)

    @property
    def fatal_sentinels(self) -> tuple[Sentinel, ...]:
        """The sentinels that invalidate the run whatever the caller requires (see `fatal_under`)."""
        return tuple(s for s in self.sentinels if s.fatal)

    def fatal_under(self, require: Collection[str] = ()) -> tuple[Sentinel, ...]:
        """The sentinels that invalidate the run when the caller requires `require` (e.g. `checkpoint_loaded`)."""
        return tuple(s for s in self.sentinels if s.fatal_under(require))

    def missing(self, require: Collection[str] = ()) -> tuple[str, ...]:
        """The required markers (expected lines) this log never printed."""
        return tuple(name for name in require if name not in self.markers)

    def summary(self) -> str:
        """One line for logs and CLIs: format, steps, columns, sentinels."""
        n = len(self.frame)
        span = f"steps {self.frame.index.min()}..{self.frame.index.max()}" if n else "no steps"
        of = f" of {self.max_steps}" if self.max_steps else ""
        fatal = len(self.fatal_sentinels)
        rank = f", rank {self.rank}" if self.rank is not None else ""
        fixed = self.first_interval.corrected_steps if self.first_interval else ()
        deaveraged = f"; de-averaged step(s): {', '.join(map(str, fixed))}" if fixed else ""
        excluded = len(self.excluded_steps)
        deaveraged += f"; {excluded} step(s) left out of the statistics" if excluded else ""
        deaveraged += f"; {len(self.gaps)} gap(s) inside the log" if self.gaps else ""
        return (f"{self.source or '<lines>'}: {self.fmt} ({self.variant}{rank}), {n} step(s), {span}{of}; "
                f"columns: {', '.join(self.columns)}; sentinels: {len(self.sentinels)} ({fatal} fatal){deaveraged}")
