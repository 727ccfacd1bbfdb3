"""The readable step lines of one rank, and how they become the canonical frame.

Restarts: a run resumed into the same log repeats steps. The last occurrence wins (it is what the resumed run
computed); every repeated step and every place the step counter went back is reported, never silently merged.

Memory and speed: values are kept as plain `str -> float` dicts, which CPython's cycle collector does not track,
so holding 100,000 steps costs no garbage-collection passes; de-duplication runs in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from operator import methodcaller
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd

from alignflow.logs.lines import Stamp, StepLine
from alignflow.logs.schema import INTEGER_COLUMNS, Resolution, Restart, Sentinel, column_order, is_loss
from alignflow.logs.sentinels import clip_text

if TYPE_CHECKING:
    from alignflow.logs.formats import LogFormatSpec

# Per-step counters that flag a step: (column, sentinel kind, fatal, message with the count).
COUNTER_RULES: tuple[tuple[str, str, bool, str], ...] = (
    ("nan_iterations", "nan_iterations", True, "number of nan iterations: {}"),
    ("skipped", "skipped_iterations", False, "number of skipped iterations: {} (optimizer step skipped)"),
    ("overflow", "overflow", False, "overflow cond: True (loss-scale overflow, update skipped)"),
)
_COUNTER_COLUMNS = tuple(rule[0] for rule in COUNTER_RULES)
# Rows from which `_frame` reads the columns with pandas' record reader.
_RECORDS_FROM = 1000
# Gaps inside a log reported one by one before a summary.
MAX_GAPS = 20


@dataclass(frozen=True, slots=True)
class _Flag:
    """What a step line needs reported (kept only for the few lines that have something)."""

    text: str
    non_finite: tuple[str, ...]
    unreadable: tuple[str, ...]
    not_read: tuple[str, ...] = ()
    damaged: tuple[str, ...] = ()
    cut: bool = False


@dataclass(frozen=True, slots=True)
class BuiltSteps:
    """The frame of one rank and what building it found."""

    frame: pd.DataFrame
    line_numbers: pd.Series
    resolution: dict[str, Resolution]
    sentinels: list[Sentinel]
    repeated_steps: list[int]
    restarts: list[Restart]
    variant: str
    max_steps: int | None
    gaps: tuple[tuple[int, int], ...] = ()


class StepRecords:
    """Step lines of one (format, rank) in file order."""

    __slots__ = ("epochs", "flags", "line_nos", "loss_columns", "max_steps", "resolution", "rows", "stamps", "steps",
                 "variants")

    def __init__(self, loss_columns: tuple[str, ...] = ()) -> None:
        self.loss_columns = loss_columns  # a line printing none of these is kept aside (`missing_loss`)
        self.steps: list[int] = []
        self.line_nos: list[int] = []
        self.rows: list[dict[str, float]] = []
        self.stamps: list[Stamp | None] = []
        self.resolution: dict[str, Resolution] = {}
        self.variants: set[str] = set()
        self.max_steps: int | None = None
        self.flags: dict[int, _Flag] = {}
        self.epochs: dict[int, tuple[int, int, int]] = {}  # index -> (epoch, step in epoch, per epoch) as printed

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, line_no: int, rec: StepLine, text: str) -> None:
        index = len(self.steps)
        self.steps.append(rec.step)
        self.line_nos.append(line_no)
        self.rows.append(rec.values)
        self.stamps.append(rec.stamp)
        self.variants.add(rec.variant)
        if rec.max_steps is not None and (self.max_steps is None or rec.max_steps > self.max_steps):
            self.max_steps = rec.max_steps
        if rec.resolutions:
            for column, res in rec.resolutions.items():
                self.resolution[column] = res.coarser(self.resolution.get(column))
        if rec.epoch is not None:
            self.epochs[index] = rec.epoch
        values = rec.values
        if rec.non_finite or rec.unreadable or rec.not_read or rec.damaged or _counted(values) or (
                self.loss_columns and not any(c in values for c in self.loss_columns)):
            self.flags[index] = _Flag(text, tuple(rec.non_finite or ()), tuple(rec.unreadable or ()),
                                      tuple(rec.not_read or ()), tuple(rec.damaged or ()), rec.cut)

    def pop(self) -> int:
        """Drop the last step line; return its line number."""
        self.flags.pop(len(self.steps) - 1, None)
        self.epochs.pop(len(self.steps) - 1, None)
        self.steps.pop()
        self.rows.pop()
        self.stamps.pop()
        return self.line_nos.pop()

    def drop_cut_ends(self) -> list[tuple[int, str]]:
        """Drop the step lines that end inside a field where the log ends or the step counter goes back: the
        process was killed while it wrote them (nothing after them continues), so what they hold is not a step's
        record; the (line, text) of each dropped one. A cut line inside a run stays, read in part."""
        n = len(self.steps)
        ends = [i for i, flag in self.flags.items() if flag.cut and (i == n - 1 or self.steps[i + 1] <= self.steps[i])]
        if not ends:
            return []
        dropped = [(self.line_nos[i], self.flags[i].text) for i in sorted(ends)]
        keep = [i for i in range(n) if i not in set(ends)]
        remap = {old: new for new, old in enumerate(keep)}
        self.steps = [self.steps[i] for i in keep]
        self.line_nos = [self.line_nos[i] for i in keep]
        self.rows = [self.rows[i] for i in keep]
        self.stamps = [self.stamps[i] for i in keep]
        self.flags = {remap[i]: f for i, f in self.flags.items() if i in remap}
        self.epochs = {remap[i]: e for i, e in self.epochs.items() if i in remap}
        return dropped

    def replace_last(self, rec: StepLine, text: str) -> None:
        """Put `rec` in place of the last step line (the same line, read again joined with its continuation)."""
        line_no = self.pop()
        self.add(line_no, rec, text)

    def rebase_epochs(self) -> str | None:
        """Number the steps of epoch-counting lines from the log's own counters; what was decided, or None.

        `Epoch:[e/E], step:[s/S]` lines count epochs from 1 (MindFormers' callbacks, `cur_epoch_num`) or from 0
        (MindSpore model-zoo monitors print `cur_epoch_num - 1` and the step in the epoch from 0,
        `(cur_step_num - 1) % batch_num`). The base is read from the counts (issue 33): an epoch 0 or a step 0
        can only be 0-based, an epoch E of E or a step S of S only 1-based; a step counter with no such evidence
        follows the epoch counter (both come from one callback), and a log with none is 1-based.
        Global step (1-based) = (epoch - epoch base) * S + (step - step base) + 1.
        """
        if not self.epochs:
            return None
        printed = list(self.epochs.values())
        epoch0 = any(e == 0 for e, _, _ in printed)
        step0 = any(s == 0 for _, s, _ in printed)
        step1 = any(s == n for _, s, n in printed)
        epoch_base = 0 if epoch0 else 1
        step_base = 0 if step0 else 1 if step1 else epoch_base
        for index, (epoch, step, per_epoch) in self.epochs.items():
            self.steps[index] = (epoch - epoch_base) * per_epoch + (step - step_base) + 1
        if (epoch_base, step_base) == (1, 1):
            return None
        return f"epochs from {epoch_base}, steps in an epoch from {step_base}"

    def classify_bad(self, line_no: int, text: str, reason: str, rank: int | None) -> Sentinel:
        """A step line that could not be read: truncation if no readable step follows it before the log ends or
        restarts (a process killed mid-write), otherwise a damaged line inside the run (fatal)."""
        i = int(np.searchsorted(self.line_nos, line_no))
        before = self.steps[i - 1] if i > 0 else None
        after = self.steps[i] if i < len(self.steps) else None
        if after is None or (before is not None and after <= before):
            return Sentinel(line_no, clip_text(text), "truncated_step_line", False,
                            f"step line cut short ({reason}) before the log ended or restarted: ignored", rank)
        return Sentinel(line_no, clip_text(text), "malformed_step_line", True,
                        f"unreadable step line in the middle of the run: {reason}", rank)

    def build(self, rank: int | None, spec: LogFormatSpec) -> BuiltSteps:
        steps = np.asarray(self.steps, dtype=np.int64)
        line_nos = np.asarray(self.line_nos, dtype=np.int64)
        unique, first_in_reversed, counts = np.unique(steps[::-1], return_index=True, return_counts=True)
        kept = len(steps) - 1 - first_in_reversed  # the last occurrence of each step, in step order
        back = np.flatnonzero(np.diff(steps) < 0) + 1
        restarts = [Restart(int(line_nos[i]), int(steps[i - 1]), int(steps[i])) for i in back]
        restart_notes = restart_sentinels(steps, line_nos, back, kept, rank)
        rows = self.rows
        frame = _frame([rows[i] for i in kept.tolist()], unique)
        unreported = spec.nan_grad_norm_unreported and _grad_norm_not_reported(frame)
        interval = log_interval(unique)
        sentinels = self._sentinels(kept, rank, ignore={"grad_norm"} if unreported else set(), interval=interval,
                                    skip_column=spec.skip_column)
        if unreported:
            frame.drop(columns="grad_norm", inplace=True)
            sentinels.append(Sentinel(int(line_nos[kept[0]]), "", "grad_norm_not_reported", False,
                                      "grad_norm is NaN on every step: the norm was not computed; column dropped"))
        excluded = {step for s in sentinels for step in s.exclude_steps}
        sentinels += self._missing_loss(kept, rank, spec.loss_columns, excluded)
        gaps = find_gaps(unique, interval)
        sentinels += gap_sentinels(gaps, unique, line_nos[kept], interval, rank)
        sentinels += restart_notes
        return BuiltSteps(
            frame=frame, line_numbers=pd.Series(line_nos[kept], index=frame.index, name="line"),
            resolution=dict(self.resolution), sentinels=sentinels,
            repeated_steps=[int(s) for s in unique[counts > 1]], restarts=restarts,
            variant="+".join(sorted(self.variants)), max_steps=self.max_steps, gaps=gaps,
        )

    def _sentinels(self, kept: npt.NDArray[np.int64], rank: int | None, *, ignore: set[str], interval: int,
                   skip_column: str | None) -> list[Sentinel]:
        """Value sentinels of the kept steps only (a NaN before a restart was recovered from); a column in
        `ignore` is not a divergence when it is not finite. A step whose `skip_column` counts every iteration of
        its interval as skipped printed no real loss (Megatron: `0` or none): it is left out of the statistics."""
        out: list[Sentinel] = []
        position = {int(i): n for n, i in enumerate(kept.tolist())}
        for index in sorted(i for i in self.flags if i in position):
            flag, line_no, values = self.flags[index], self.line_nos[index], self.rows[index]
            text = clip_text(flag.text)
            bad = [c for c in flag.non_finite if (is_loss(c) or c == "grad_norm") and c not in ignore]
            if bad:
                out.append(Sentinel(line_no, text, "non_finite_value", True, f"{', '.join(bad)} is NaN or inf", rank))
            if flag.unreadable:
                out.append(Sentinel(line_no, text, "unreadable_value", False,
                                    f"value of {', '.join(flag.unreadable)} unreadable: left out", rank))
            if flag.damaged:
                out.append(Sentinel(line_no, text, "damaged_value", True,
                                    f"{', '.join(flag.damaged)}: a field this format prints as a number holds "
                                    "something else (a damaged line)", rank))
            if flag.not_read:
                out.append(Sentinel(line_no, text, "partial_step_line", False,
                                    "every complete field was read; " + "; ".join(flag.not_read), rank))
            for col, kind, fatal, message in COUNTER_RULES:
                count = values.get(col, 0.0)
                if count > 0:
                    text_of = message.format(int(count) if count < 2**53 else count)
                    exclude: tuple[int, ...] = ()
                    if col == skip_column:
                        n = position[index]
                        step = self.steps[index]
                        span = step - self.steps[int(kept[n - 1])] if n > 0 else min(step, interval)
                        if count >= span:
                            exclude = (step,)
                            text_of += "; every iteration of the interval skipped: no loss, left out of the statistics"
                    out.append(Sentinel(line_no, text, kind, fatal, text_of, rank, exclude_steps=exclude))
        return out

    def _missing_loss(self, kept: npt.NDArray[np.int64], rank: int | None, loss_columns: tuple[str, ...],
                      excluded: set[int]) -> list[Sentinel]:
        """A step line without the format's loss (Megatron leaves a NaN or non-positive loss out of its line, and
        `number of nan iterations` can stay 0): fatal, naming the steps, unless the line says why (nan iterations
        counted, or every iteration of its interval skipped)."""
        if not loss_columns:
            return []
        rows = self.rows
        kept_rows = [rows[i] for i in kept.tolist()]
        column = next((c for c in loss_columns if any(c in row for row in kept_rows)), None)
        # a line read in part (cut, glued) may have lost its loss with the part not read: that is said by its own
        # `partial_step_line` warning, not taken for a diverged step
        partial = {i for i, flag in self.flags.items() if flag.not_read}
        missing = [int(i) for i, row in zip(kept.tolist(), kept_rows, strict=True)
                   if (column is None or column not in row) and not row.get("nan_iterations", 0.0) > 0
                   and self.steps[i] not in excluded and i not in partial]
        if not missing:
            return []
        first = missing[0]
        flag = self.flags.get(first)
        name = " or ".join(loss_columns) if column is None else column
        where = "any step line" if len(missing) == len(kept_rows) else f"{len(missing)} step line(s)"
        return [Sentinel(self.line_nos[first], clip_text(flag.text if flag else ""), "missing_loss", True,
                         f"no {name} on {where}: steps {step_ranges([self.steps[i] for i in missing])} (the "
                         "framework leaves a NaN loss out of its line: a diverged run)", rank)]


def _frame(rows: list[dict[str, float]], steps: npt.NDArray[np.int64]) -> pd.DataFrame:
    """The rows as a frame indexed by step: columns in canonical order, NaN where a row lacks the column, and an
    integer column (INTEGER_COLUMNS) as nullable integers when every value it has is a whole number.

    Built column by column in numpy and handed to pandas once: this runs on every parse, and pandas' record path,
    column reindex and per-column assignment made a short log's parse 0.31 ms instead of 0.17. A long log's
    columns come from pandas' record reader, faster than a Python pass per column from about 1,000 rows on."""
    names: dict[str, float] = {}
    for row in rows:
        names.update(row)
    ordered = column_order(list(names))
    if len(rows) >= _RECORDS_FROM:
        records = pd.DataFrame.from_records(rows, columns=ordered)
        arrays = {name: records[name].to_numpy(dtype=np.float64, na_value=np.nan) for name in ordered}
    else:
        arrays = {name: np.fromiter(map(methodcaller("get", name, np.nan), rows), dtype=np.float64, count=len(rows))
                  for name in ordered}
    columns: dict[str, npt.NDArray[np.float64] | pd.arrays.IntegerArray] = {}
    for name, values in arrays.items():
        if name in INTEGER_COLUMNS:
            missing = np.isnan(values)
            known = values[~missing]
            if np.all(np.abs(known) < 2.0**53) and np.all(known == np.floor(known)):  # (inf, nan fail the first)
                columns[name] = pd.arrays.IntegerArray(np.where(missing, 0, values).astype(np.int64), missing)
                continue
        columns[name] = values
    return pd.DataFrame(columns, index=pd.Index(steps, name="step"))


def restart_sentinels(steps: npt.NDArray[np.int64], line_nos: npt.NDArray[np.int64], back: npt.NDArray[np.intp],
                      kept: npt.NDArray[np.int64], rank: int | None) -> list[Sentinel]:
    """A warning where the step counter goes back (a restart, or another run appended to the log), naming the runs
    the log holds and which one each compared step comes from (the last that printed it).

    Why a warning: a log with a bad run followed by a good run of the same steps is compared on the good one, and
    a reader must be told that the first one exists and is not what was compared (issue 33).
    """
    if not len(back):
        return []
    bounds = [0, *(int(i) for i in back), len(steps)]
    runs = [(int(line_nos[a]), int(line_nos[b - 1]), int(steps[a]), int(steps[b - 1])) for a, b in pairwise(bounds)]
    run_of = np.searchsorted(np.asarray(bounds[1:-1]), kept, side="right")  # the run each kept line belongs to
    compared = [np.count_nonzero(run_of == n) for n in range(len(runs))]

    def name(n: int) -> str:
        first_line, last_line, first_step, last_step = runs[n]
        return f"run {n + 1} (lines {first_line}-{last_line}, steps {first_step}-{last_step})"

    out = []
    for n in range(1, len(runs)):
        before = runs[n - 1]
        superseded = [name(k) for k in range(n) if compared[k] == 0]
        still = [f"{name(k)} for {compared[k]} step(s) it alone printed" for k in range(len(runs)) if compared[k]
                 and k != len(runs) - 1]
        message = (f"the step counter goes back from {before[3]} to {runs[n][2]}: the log holds {len(runs)} runs "
                   f"(a restart, or a run appended to the log); compared: {name(len(runs) - 1)}")
        if still:
            message += "; also from " + ", ".join(still)
        if superseded:
            message += f"; not compared: {', '.join(superseded)}"
        out.append(Sentinel(runs[n][0], "", "restart", False, message, rank))
    return out


def log_interval(steps: npt.NDArray[np.int64]) -> int:
    """The printing interval: the most common difference between consecutive printed steps (1 if unknown)."""
    if len(steps) < 2:
        return 1
    diffs, counts = np.unique(np.diff(steps), return_counts=True)
    return int(diffs[int(np.argmax(counts))])


def find_gaps(steps: npt.NDArray[np.int64], interval: int) -> tuple[tuple[int, int], ...]:
    """Runs of steps missing inside the log: wherever two printed steps are further apart than the interval.

    A shorter step (megatron-core >= 0.16 prints iteration 1 before the interval's grid) is no gap."""
    if len(steps) < 3:
        return ()
    at = np.flatnonzero(np.diff(steps) > interval)
    return tuple((int(steps[i]) + 1, int(steps[i + 1]) - 1) for i in at)


def gap_sentinels(gaps: tuple[tuple[int, int], ...], steps: npt.NDArray[np.int64], line_nos: npt.NDArray[np.int64],
                  interval: int, rank: int | None) -> list[Sentinel]:
    """One warning per gap (the first MAX_GAPS, then one summary), at the line after the gap."""
    every = "every step" if interval == 1 else f"every {interval} steps"
    out = []
    for first, last in gaps[:MAX_GAPS]:
        i = int(np.searchsorted(steps, last + 1))
        expected = (last + 1 - first) // interval if interval > 1 else last + 1 - first
        out.append(Sentinel(int(line_nos[i]), "", "step_gap", False,
                            f"no step line for steps {first}-{last} inside the log (it prints {every}; "
                            f"{expected} line(s) missing)", rank))
    if len(gaps) > MAX_GAPS:
        out.append(Sentinel(out[-1].line_no, "", "step_gap", False,
                            f"and {len(gaps) - MAX_GAPS} more gap(s) inside the log", rank))
    return out


def step_ranges(steps: list[int], limit: int = 20) -> str:
    """`1-3, 7, 9-10` for [1, 2, 3, 7, 9, 10] (the first `limit` runs, then a count)."""
    runs: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return text + (f" and {len(runs) - limit} more range(s)" if len(runs) > limit else "")


def _counted(values: dict[str, float]) -> bool:
    get = values.get
    for column in _COUNTER_COLUMNS:  # noqa: SIM110 - a plain loop: this runs once per step line
        if get(column, 0.0) > 0:
            return True
    return False


def _grad_norm_not_reported(frame: pd.DataFrame) -> bool:
    """MindFormers prints `grad_norm: NaN` on every step when it does not compute the norm: not a divergence."""
    return "grad_norm" in frame.columns and len(frame) >= 2 and not frame["grad_norm"].notna().any()
