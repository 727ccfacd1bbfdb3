"""The readable step lines of one rank, and how they become the canonical frame.

Restarts: a run resumed into the same log repeats steps. The last occurrence wins (it is what the resumed run
computed); every repeated step and every place the step counter went back is reported, never silently merged.

Memory and speed: values are kept as plain `str -> float` dicts, which CPython's cycle collector does not track,
so holding 100,000 steps costs no garbage-collection passes; de-duplication runs in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from alignflow.logs.lines import Stamp, StepLine
from alignflow.logs.schema import INTEGER_COLUMNS, Resolution, Restart, Sentinel, column_order, is_loss
from alignflow.logs.sentinels import clip_text

# Per-step counters that flag a step: (column, sentinel kind, fatal, message with the count).
COUNTER_RULES: tuple[tuple[str, str, bool, str], ...] = (
    ("nan_iterations", "nan_iterations", True, "number of nan iterations: {}"),
    ("skipped", "skipped_iterations", False, "number of skipped iterations: {} (optimizer step skipped)"),
    ("overflow", "overflow", False, "overflow cond: True (loss-scale overflow, update skipped)"),
)
_COUNTER_COLUMNS = tuple(rule[0] for rule in COUNTER_RULES)


@dataclass(frozen=True, slots=True)
class _Flag:
    """What a step line needs reported (kept only for the few lines that have something)."""

    text: str
    non_finite: tuple[str, ...]
    unreadable: tuple[str, ...]


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


class StepRecords:
    """Step lines of one (format, rank) in file order."""

    __slots__ = ("flags", "line_nos", "max_steps", "resolution", "rows", "stamps", "steps", "variants")

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.line_nos: list[int] = []
        self.rows: list[dict[str, float]] = []
        self.stamps: list[Stamp | None] = []
        self.resolution: dict[str, Resolution] = {}
        self.variants: set[str] = set()
        self.max_steps: int | None = None
        self.flags: dict[int, _Flag] = {}

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
        if rec.non_finite or rec.unreadable or _counted(rec.values):
            self.flags[index] = _Flag(text, tuple(rec.non_finite or ()), tuple(rec.unreadable or ()))

    def pop(self) -> int:
        """Drop the last step line; return its line number."""
        self.flags.pop(len(self.steps) - 1, None)
        self.steps.pop()
        self.rows.pop()
        self.stamps.pop()
        return self.line_nos.pop()

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

    def build(self, rank: int | None) -> BuiltSteps:
        steps = np.asarray(self.steps, dtype=np.int64)
        line_nos = np.asarray(self.line_nos, dtype=np.int64)
        unique, first_in_reversed, counts = np.unique(steps[::-1], return_index=True, return_counts=True)
        kept = len(steps) - 1 - first_in_reversed  # the last occurrence of each step, in step order
        back = np.flatnonzero(np.diff(steps) < 0) + 1
        restarts = [Restart(int(line_nos[i]), int(steps[i - 1]), int(steps[i])) for i in back]
        rows = self.rows
        frame = pd.DataFrame.from_records([rows[i] for i in kept], index=pd.Index(unique, name="step"))
        unreported = _grad_norm_not_reported(frame)
        sentinels = self._sentinels(kept, rank, ignore={"grad_norm"} if unreported else set())
        if unreported:
            frame.drop(columns="grad_norm", inplace=True)
            sentinels.append(Sentinel(int(line_nos[kept[0]]), "", "grad_norm_not_reported", False,
                                      "grad_norm is NaN on every step: the norm was not computed; column dropped"))
        frame = frame[column_order(list(frame.columns))]
        for col in INTEGER_COLUMNS & set(frame.columns):
            values = frame[col]
            if values.dropna().mod(1).eq(0).all():
                frame[col] = values.astype("Int64")
        return BuiltSteps(
            frame=frame, line_numbers=pd.Series(line_nos[kept], index=frame.index, name="line"),
            resolution=dict(self.resolution), sentinels=sentinels,
            repeated_steps=[int(s) for s in unique[counts > 1]], restarts=restarts,
            variant="+".join(sorted(self.variants)), max_steps=self.max_steps,
        )

    def _sentinels(self, kept: npt.NDArray[np.int64], rank: int | None, *, ignore: set[str]) -> list[Sentinel]:
        """Value sentinels of the kept steps only (a NaN before a restart was recovered from); a column in
        `ignore` is not a divergence when it is not finite."""
        out: list[Sentinel] = []
        keep = set(kept.tolist())
        for index in sorted(i for i in self.flags if i in keep):
            flag, line_no, values = self.flags[index], self.line_nos[index], self.rows[index]
            text = clip_text(flag.text)
            bad = [c for c in flag.non_finite if (is_loss(c) or c == "grad_norm") and c not in ignore]
            if bad:
                out.append(Sentinel(line_no, text, "non_finite_value", True, f"{', '.join(bad)} is NaN or inf", rank))
            if flag.unreadable:
                out.append(Sentinel(line_no, text, "unreadable_value", False,
                                    f"value of {', '.join(flag.unreadable)} unreadable: left out", rank))
            for col, kind, fatal, message in COUNTER_RULES:
                count = values.get(col, 0.0)
                if count > 0:
                    out.append(Sentinel(line_no, text, kind, fatal, message.format(int(count)), rank))
        return out


def _counted(values: dict[str, float]) -> bool:
    get = values.get
    for column in _COUNTER_COLUMNS:  # noqa: SIM110 - a plain loop: this runs once per step line
        if get(column, 0.0) > 0:
            return True
    return False


def _grad_norm_not_reported(frame: pd.DataFrame) -> bool:
    """MindFormers prints `grad_norm: NaN` on every step when it does not compute the norm: not a divergence."""
    return "grad_norm" in frame.columns and len(frame) >= 2 and not frame["grad_norm"].notna().any()
