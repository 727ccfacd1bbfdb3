"""Megatron's first printed interval: recover per-iteration values from the line that averages it (core >= 0.16).

Why (docs/megatron.md#first-iteration-and-interval-averaging, "First iteration"): since megatron-core 0.16
`training_log` prints the first iteration
of every process (`is_first_iteration`) but does not reset its accumulators after it (`should_reset = not
is_first_iteration`). The process's next printed line, iteration k, therefore reports for every key of
`total_loss_dict` (`lm loss`, each `mtp_k loss`, the MoE losses) the mean over its advanced iterations s..k, and its
skipped / nan counters count iteration s again; `grad norm`, `learning rate` and `loss scale` are k's own. With
`--log-interval 1` the iteration-2 line is the mean of iterations 1 and 2: compared as printed with the NPU's step 2
it looks like a step-2 outlier (plausibly docs/seeds.md#step-2-outlier-after-the-first-adam-update) and moves
ME(lm_loss) by ~3e-3 on the demo.
megatron-core 0.8-0.15 printed iteration 1 only when `1 % log_interval == 0` and reset after every line;
Megatron-Bridge's own loop prints on the interval only and resets.

The correction, per process, from its first line s and its next line k (A = the advanced iterations a line
averages: A_s = 1 - skipped_s, A_k = (k - s + 1) - skipped_k, both counters cumulative since the process began):

    mean over s+1..k = (A_k * v_k - A_s * v_s) / (A_k - A_s)      (k = 2, nothing skipped: 2 * v_2 - v_1)

and line k's counters minus line s's. It is exact up to the printed rounding, which it amplifies by up to
(A_k + A_s) / (A_k - A_s) (3 for 2 * v_2 - v_1); the note records that factor for each corrected step.

Deciding "0.16+" (`first_interval="auto"`), per process, from its first line: a microsecond timestamp -> yes; a
seconds-only one (0.8-0.15, Megatron-Bridge) -> no (an RFC 3339 stamp a fork or a collector printed in its place,
`[2025-10-21T16:18:53+08:00]`, counts by its precision the same way); no timestamp (Megatron-Bridge docs, filtered
logs) -> yes only when that line was printed off the `--log-interval` grid the following lines keep (only 0.16+
prints out of turn), otherwise undecidable: left as printed, and the note says so. `"deaverage"` takes every process
as 0.16+; `"raw"` changes nothing but still records what the evidence says.

A process starts at the log's first step line, after a `training ...` / `[before the start of training step]` /
`successfully loaded checkpoint ... at iteration N` line, and where the step counter goes back (a restart). Its first
printed iteration must be 1 (fresh) or N + 1 (loaded). A log that starts later without those lines may be a tail; a
missing or unreadable first line, missing lines, or a loss that iteration s did not print leave the value as
printed, with the reason in the note (and a warning sentinel where the value is known to be an average).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from alignflow.logs import megatron
from alignflow.logs.lines import Stamp
from alignflow.logs.schema import FirstInterval, FirstIntervalChoice, FirstIntervalNote, Resolution, Sentinel, is_loss
from alignflow.logs.steps import StepRecords

# Counters of `total_loss_dict` that are sums since the last reset (so they count iteration s twice).
COUNTERS: tuple[str, ...] = ("skipped", "nan_iterations")
SENTINEL_KIND = "first_interval_averaged"
_STAMP_EVIDENCE: dict[Stamp, tuple[bool, str]] = {
    "micro": (True, "microsecond timestamps: megatron-core >= 0.16, which keeps averaging after the first printed "
                    "iteration"),
    "seconds": (False, "seconds-only timestamps: megatron-core <= 0.15 or Megatron-Bridge, which reset after every "
                       "printed line"),
}
_NO_STAMP = ("no timestamp (Megatron-Bridge or a filtered log): the megatron-core version cannot be told; pass "
             "first_interval=deaverage if the log is from megatron-core >= 0.16")


@dataclass(frozen=True, slots=True)
class ProcessStarts:
    """Non-step lines that show where a Megatron process starts training, and the rank's unreadable step lines."""

    # where: the line number (a late marker settled before an earlier step line sits half a line above it)
    training: tuple[float, ...] = ()  # where `training ...` / `[before the start of training step]` was printed
    loaded: tuple[tuple[float, int], ...] = ()  # (where, N) of `successfully loaded checkpoint ... at iteration N`
    unreadable: tuple[tuple[int, int | None], ...] = ()  # (line, iteration or None) of unreadable step lines

    @classmethod
    def from_lines(cls, occurrences: dict[str, list[tuple[int, str]]],
                   unreadable: Iterable[tuple[int, str]]) -> ProcessStarts:
        """From the sentinel scanner's marker occurrences and the (line, text) of unreadable step lines."""
        loaded = []
        for line_no, text in occurrences.get("checkpoint_loaded", []):
            m = megatron.LOADED_AT.search(text)
            if m is not None:
                loaded.append((line_no, int(m.group(1))))
        return cls(
            training=tuple(sorted(line for line, _ in occurrences.get("training_started", []))),
            loaded=tuple(sorted(loaded)), unreadable=tuple(sorted((n, megatron.step_of(t)) for n, t in unreadable)),
        )

    def settled(self, steps: Sequence[int], line_nos: Sequence[int]) -> ProcessStarts:
        """The markers, each moved above the step line it announces when another rank's line came after it.

        Megatron prints `training ...` and the load line on rank 0 (`print_rank_0`) and the iteration lines on the
        last rank; where the ranks' outputs are merged (torchrun `--tee`, a shared Slurm output file) the order
        between two ranks is only as good as each stream's flushing. A marker announces the step its process
        prints first (1 when fresh, N + 1 after loading iteration N): found after that step's line, with the step
        counter still going up to the next line, it is late, not a new process whose first line is missing.
        """
        if not steps:
            return self
        lines = np.asarray(line_nos, dtype=np.float64)
        rising = np.diff(np.asarray(steps, dtype=np.int64)) > 0  # rising[i]: line i + 1 continues line i's process

        def settle(where: float, first: int) -> float:
            j = int(np.searchsorted(lines, where))  # the first step line after the marker
            if j == 0 or j == len(steps) or steps[j] == first or not rising[j - 1]:
                return where
            i = j - 1  # back along the rising steps to the one the marker announces
            while i > 0 and steps[i] != first and rising[i - 1]:
                i -= 1
            return float(lines[i]) - 0.5 if steps[i] == first else where

        loaded = tuple(sorted((settle(where, n + 1), n) for where, n in self.loaded))

        def first_of_training(where: float) -> int:
            """A process that loaded iteration N printed its load line before `training ...`: it starts at N + 1."""
            before = [n for line, n in self.loaded if line < where]
            return before[-1] + 1 if before else 1

        return ProcessStarts(training=tuple(sorted(settle(where, first_of_training(where)) for where in self.training)),
                             loaded=loaded, unreadable=self.unreadable)

    def in_between(self, after: float, before: float) -> tuple[bool, int | None, list[tuple[int, int | None]]]:
        """Between two lines: whether training started, the last loaded iteration, the unreadable step lines."""
        started = any(after < line < before for line in self.training)
        loaded = [n for line, n in self.loaded if after < line < before]
        bad = [(line, step) for line, step in self.unreadable if after < line < before]
        return started, (loaded[-1] if loaded else None), bad


@dataclass(frozen=True, slots=True)
class Outcome:
    """What `deaverage` did: the note (every process start that printed a second line) and its warnings."""

    note: FirstIntervalNote
    warnings: tuple[Sentinel, ...]

    def kept(self, lines: Iterable[int]) -> Outcome:
        """Only what concerns the given step lines (those a restart did not supersede)."""
        keep = set(lines)
        return Outcome(FirstIntervalNote(self.note.mode, tuple(i for i in self.note.intervals if i.line in keep)),
                       tuple(w for w in self.warnings if w.line_no in keep))


def deaverage(records: StepRecords, starts: ProcessStarts, *, mode: FirstIntervalChoice,
              rank: int | None = None) -> Outcome:
    """Undo the first-interval averaging of each process in `records` (its rows are replaced in place)."""
    intervals: list[FirstInterval] = []
    warnings: list[Sentinel] = []
    starts = starts.settled(records.steps, records.line_nos)
    firsts = process_firsts(records.steps, records.line_nos, starts)
    for f, end in zip(firsts, [*firsts[1:], len(records.steps)], strict=True):
        interval = _one_process(records, f, end, starts, mode)
        if interval is None:
            continue
        intervals.append(interval)
        if interval.kept and mode != "raw":
            warnings.append(Sentinel(
                interval.line, "", SENTINEL_KIND, False,
                f"{', '.join(interval.kept)} at step {interval.step} may be the mean of iterations "
                f"{interval.first_step}..{interval.step} (megatron-core >= 0.16 first-interval averaging) and could "
                f"not be recovered: {interval.reason}", rank))
    return Outcome(FirstIntervalNote(mode, tuple(intervals)), tuple(warnings))


def process_firsts(steps: Sequence[int], line_nos: Sequence[int], starts: ProcessStarts) -> list[int]:
    """Indices of the step lines that begin a process: the first, after a training-start or load line, a restart."""
    if not steps:
        return []
    marks = np.asarray(sorted([*starts.training, *(line for line, _ in starts.loaded)]), dtype=np.float64)
    before = np.searchsorted(marks, np.asarray(line_nos, dtype=np.float64))  # start lines before each step line
    new = np.diff(before, prepend=0) > 0
    new[1:] |= np.diff(np.asarray(steps, dtype=np.int64)) <= 0
    new[0] = True
    return [int(i) for i in np.flatnonzero(new)]


def _one_process(records: StepRecords, f: int, end: int, starts: ProcessStarts,
                 mode: FirstIntervalChoice) -> FirstInterval | None:
    steps, lines = records.steps, records.line_nos
    s = steps[f]
    started, loaded, bad = starts.in_between(lines[f - 1] if f else -math.inf, lines[f])
    expected = loaded + 1 if loaded is not None else (1 if started else None)
    averaged, why = _decide("auto" if mode == "raw" else mode, records.stamps[f], steps[f:min(end, f + 3)])
    if expected is not None and s != expected and averaged and mode != "raw":
        # the process's first iteration printed no readable line: line s may itself be the averaged one
        what = "an unreadable line" if any(step is None or step < s for _, step in bad) else "no line"
        return FirstInterval(expected, None, s, lines[f], False,
                             f"iteration {expected}, the process's first, has {what} in the log",
                             kept=_averaged_columns(records.rows[f], records.resolution))
    if end - f < 2:
        return None
    k, line_k = steps[f + 1], lines[f + 1]
    columns = _averaged_columns(records.rows[f + 1], records.resolution)

    def raw(reason: str, *, kept: tuple[str, ...] = ()) -> FirstInterval:
        return FirstInterval(s, lines[f], k, line_k, False, reason, kept=kept)

    if mode == "raw":
        said = f"; step {k} is the mean of iterations {s}..{k} ({why})" if averaged else f" ({why})"
        return raw(f"first_interval=raw{said}")
    if not averaged:
        return raw(why)
    restart = f > 0 and s <= steps[f - 1]
    if expected is None and not restart and s != 1:
        return raw(f"cannot tell whether step {s} was its process's first printed iteration (no `training ...` or "
                   "checkpoint-load line before it, and not iteration 1: is the log's head missing?)")
    if any(step is None or step < s for _, step in bad):
        return raw(f"an unreadable step line (line {bad[0][0]}) may be the process's first", kept=columns)
    inside = starts.in_between(lines[f], line_k)[2]
    if inside:
        return raw(f"the first interval ended at the unreadable line {inside[0][0]}: step {k} is a normal interval")
    if end - f > 2:
        n = steps[f + 2] - k
        if n > 0 and k != (s // n + 1) * n:
            return raw(f"the lines after step {s} are {n} apart, so the next printed iteration was {(s // n + 1) * n}, "
                       f"not {k}: its line is missing, and step {k} is a normal interval")
    return _correct(records, f, columns, why)


def _correct(records: StepRecords, f: int, columns: tuple[str, ...], why: str) -> FirstInterval:
    """Replace line k's averaged values by the per-iteration values of s+1..k (the module docstring's formula)."""
    s, k = records.steps[f], records.steps[f + 1]
    first, line = records.rows[f], records.rows[f + 1]
    a_s = 1.0 - first.get("skipped", 0.0)
    a_k = (k - s + 1) - line.get("skipped", 0.0)

    def raw(reason: str) -> FirstInterval:
        return FirstInterval(s, records.line_nos[f], k, records.line_nos[f + 1], False, reason, kept=columns)

    if a_s not in (0.0, 1.0) or a_k < a_s:
        return raw(f"the skipped-iteration counters ({1 - a_s:g} at step {s}, {k - s + 1 - a_k:g} at step {k}) "
                   "do not fit one process")
    if a_k == a_s:
        return raw(f"no iteration after {s} advanced (all skipped): the losses at step {k} repeat iteration {s}'s")
    fixed = dict(line)
    done: list[str] = []
    kept: list[str] = []
    for column in columns:
        value = line[column]
        if a_s == 0.0 or not math.isfinite(value):
            continue  # iteration s was skipped (not in the sums), or nothing to recover
        before = first.get(column)
        if before is None or not math.isfinite(before):
            kept.append(column)
            continue
        fixed[column] = (a_k * value - a_s * before) / (a_k - a_s)
        done.append(column)
    for column in COUNTERS:
        if column in line and first.get(column, 0.0) > 0:
            fixed[column] = line[column] - first[column]
            done.append(column)
    records.rows[f + 1] = fixed
    reason = why
    if a_s == 0.0:
        reason += f"; iteration {s} was skipped, so its loss is not in step {k}'s averages"
    if kept:
        flag = records.flags.get(f)
        cut = flag is not None and bool(flag.not_read)
        reason += (f"; step {s}'s line was read only in part (line {records.line_nos[f]} ends inside a field): its "
                   f"{', '.join(kept)} are not known" if cut else f"; step {s} printed no finite {', '.join(kept)}")
    if not done and not kept:
        reason += f"; step {k} printed no averaged value to recover"
    factor = (a_k + a_s) / (a_k - a_s) if a_s else 1.0
    return FirstInterval(s, records.line_nos[f], k, records.line_nos[f + 1], bool(done), reason, tuple(done),
                         tuple(kept), factor)


def _decide(mode: FirstIntervalChoice, stamp: Stamp | None, steps: Sequence[int]) -> tuple[bool, str]:
    """Whether the process's next line averages its first iteration in, and the evidence."""
    if mode == "deaverage":
        return True, "first_interval=deaverage"
    evidence = _STAMP_EVIDENCE.get(stamp) if stamp is not None else None
    if evidence is not None:
        return evidence
    if len(steps) == 3:
        s, k, n = steps[0], steps[1], steps[2] - steps[1]
        if n > 1 and k % n == 0 and s % n != 0 and k == (s // n + 1) * n:
            return True, (f"step {s} was printed off the --log-interval {n} grid of the lines after it: only "
                          "megatron-core >= 0.16 prints the first iteration out of turn (no timestamp)")
    return False, _NO_STAMP


def _averaged_columns(values: dict[str, float], resolution: dict[str, Resolution]) -> tuple[str, ...]:
    """Columns of `total_loss_dict`: every loss, and any other key printed `{:.6E}` except the learning rate."""

    def averaged(column: str) -> bool:
        if is_loss(column):
            return True
        res = resolution.get(column)
        return res is not None and res.kind == "significant" and column != "lr" and "learning_rate" not in column

    return tuple(c for c in values if averaged(c))
