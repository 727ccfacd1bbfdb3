"""Sentinels: log lines that make a run invalid even when its process exited 0, and the check that enforces them.

Why this exists: both frameworks report several failed checkpoint loads as success. Megatron falls back to a
non-strict load and prints only `load_return: None`; a missing tracker, an unreadable `.pt` or
`--exit-on-missing-checkpoint` all exit with code 0 (docs/megatron.md#log-sentinels). MindFormers trains from random
weights after `Skipping checkpoint loading` (docs/mindformers.md#loading-a-checkpoint-for-training). The only evidence
is in the log, so the
rules below are data, one table per framework, scanned over every non-step line; values (NaN/inf losses, a
nonzero `number of nan iterations`, a loss left out of a line) are checked on the parsed steps.

A rule may be fatal only under a requirement (`fatal_when`: a from-scratch run is fine unless the caller
requires a loaded checkpoint), take the step it names out of the statistics (`step_group`: MindFormers'
skipped-data steps), or report a running count only when it grows (`counter_group`: DeepSpeed's `skipped=N`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from alignflow.errors import SentinelError
from alignflow.logs.schema import ParsedLog, Sentinel

# Longest line text kept in a sentinel (a traceback line can be very long).
MAX_TEXT = 400
# How many fatal lines a SentinelError message spells out before summarising the rest.
MAX_LISTED = 200
# The requirement a pipeline training sets: a checkpoint was loaded (its marker, and the rules it makes fatal).
CHECKPOINT_LOADED = "checkpoint_loaded"


@dataclass(frozen=True, slots=True)
class LineRule:
    """One kind of sentinel line: a cheap literal `needle`, optionally a regex and a condition on its match."""

    kind: str
    needle: str
    fatal: bool
    message: str
    pattern: re.Pattern[str] | None = None
    when: Callable[[re.Match[str]], bool] | None = None
    lists_names: bool = False  # the offending names follow on `  - <name>` lines
    benign_names: frozenset[str] = frozenset()  # listed names ending in one of these do not make it fatal
    fatal_when: str | None = None  # a requirement (`checkpoint_loaded`) under which a non-fatal rule is fatal
    step_group: int | None = None  # the pattern group holding the step this line takes out of the statistics
    counter_group: int | None = None  # the pattern group holding a running count: reported only when it grows


@dataclass(frozen=True, slots=True)
class Marker:
    """An expected event (e.g. `checkpoint_loaded`): its first line is recorded so a caller can require it.

    With `every=True` each occurrence is also kept (line number and text), for events that happen once per
    process of a restarted run.
    """

    name: str
    needle: str
    every: bool = False


_LISTED_NAME = re.compile(r"(?:^|\s)-\s+([\w.\[\]/]+)\s*$")


class SentinelScanner:
    """Feeds non-step lines through the rule tables; collects sentinels and markers (stateful, one pass)."""

    def __init__(self, rules: Sequence[LineRule], markers: Sequence[Marker]) -> None:
        self._rules = tuple(rules)
        self._markers = tuple(markers)
        self.sentinels: list[Sentinel] = []
        self.markers: dict[str, int] = {}
        self.occurrences: dict[str, list[tuple[int, str]]] = {}
        self._listing: tuple[LineRule, int, str, int | None, list[str]] | None = None
        self._counts: dict[tuple[str, int | None], int] = {}

    def feed(self, line_no: int, text: str, rank: int | None) -> None:
        if self._listing is not None:
            m = _LISTED_NAME.search(text)
            if m:
                self._listing[4].append(m.group(1))
                return
            self._close_listing()
        for rule in self._rules:
            if rule.needle not in text:
                continue
            m = None
            if rule.pattern is not None:
                m = rule.pattern.search(text)
                if m is None or (rule.when is not None and not rule.when(m)):
                    continue
            if rule.lists_names:
                self._listing = (rule, line_no, text, rank, [])
                return
            message = rule.message
            steps: tuple[int, ...] = ()
            if m is not None and rule.counter_group is not None:
                count, key = int(m.group(rule.counter_group)), (rule.kind, rank)
                if count <= self._counts.get(key, 0):
                    return
                message = f"{message}: {count} (was {self._counts.get(key, 0)})"
                self._counts[key] = count
            if m is not None and rule.step_group is not None:
                steps = (int(m.group(rule.step_group)),)
            self.sentinels.append(Sentinel(line_no, clip_text(text), rule.kind, rule.fatal, message, rank,
                                           exclude_steps=steps, fatal_when=rule.fatal_when))
            return
        for marker in self._markers:
            if marker.every:
                if marker.needle in text:
                    self.occurrences.setdefault(marker.name, []).append((line_no, text))
                    self.markers.setdefault(marker.name, line_no)
            elif marker.name not in self.markers and marker.needle in text:
                self.markers[marker.name] = line_no

    def finish(self) -> None:
        self._close_listing()

    def _close_listing(self) -> None:
        if self._listing is None:
            return
        rule, line_no, text, rank, names = self._listing
        self._listing = None
        benign = bool(names) and all(n.rsplit(".", 1)[-1] in rule.benign_names for n in names)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        message = rule.message + (f": {shown}" if names else "")
        if benign:
            message += " (only per-step counters: harmless)"
        self.sentinels.append(Sentinel(line_no, clip_text(text), rule.kind, rule.fatal and not benign, message, rank,
                                       fatal_when=rule.fatal_when))


def clip_text(text: str) -> str:
    """A line as a sentinel keeps it: stripped, at most MAX_TEXT characters."""
    text = text.strip()
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def check_sentinels(parsed: ParsedLog, *, require: Iterable[str] = ()) -> None:
    """Raise `SentinelError` listing each fatal sentinel line of `parsed` (and each required marker not seen).

    `require` names what the caller requires of the run, each a marker that must be present. `CHECKPOINT_LOADED`
    (`require=(CHECKPOINT_LOADED,)`, what a pipeline training asks) also makes the "started from random weights"
    lines fatal (Megatron's `will not load any checkpoints`, MindFormers' `Skipping checkpoint loading`): a load
    that never reported success is as invalid as one that reported failure. Without it those lines are warnings,
    since that is how a from-scratch run starts.
    """
    require = tuple(require)
    fatal = list(parsed.fatal_under(require))
    missing = list(parsed.missing(require))
    if not fatal and not missing:
        return
    where = parsed.source or "log"
    lines = [s.describe(parsed.source) for s in fatal[:MAX_LISTED]]
    if len(fatal) > MAX_LISTED:
        lines.append(f"... and {len(fatal) - MAX_LISTED} more fatal line(s)")
    lines += [f"{where}: required line not found: {name}" for name in missing]
    header = f"{where}: the run is invalid although it may have exited 0 ({len(fatal)} fatal line(s)"
    header += f", {len(missing)} required line(s) missing)" if missing else ")"
    raise SentinelError(header + "\n" + "\n".join("  " + line for line in lines), sentinels=fatal)
