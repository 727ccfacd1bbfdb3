"""`parse_log`: lines in, `ParsedLog` out — format detection, ranks, restarts, sentinels, the canonical frame.

Pure: it reads the lines it is given and nothing else (`parse_log_file` is the one convenience that opens a
file). One pass over the input; step lines go to the framework parser, every other line to the sentinel tables.

Ranks: torchrun `--tee` writes `[default3]:` before each line (any role name; `[3]:` with a global-rank
template), `srun --label` writes `3: `, OpenMPI `mpirun --tag-output` `[1,3]<stdout>:`. Lines are grouped by
that prefix. The default rank is the highest one that printed real losses — the last pipeline stage, which is the
one whose loss is valid (Megatron prints only there; MindFormers prints `loss: N/A` elsewhere). Text sentinels
are collected from every rank: a failed load on any rank invalidates the run. Restarts and the frame itself:
`alignflow.logs.steps`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path

from alignflow.errors import LogParseError
from alignflow.logs.checks import near_misses
from alignflow.logs.first_interval import ProcessStarts, deaverage
from alignflow.logs.formats import FORMATS, LogFormatSpec, all_markers, all_rules
from alignflow.logs.lines import StepLine
from alignflow.logs.schema import FIRST_INTERVAL_CHOICES, FirstIntervalChoice, ParsedLog, Sentinel
from alignflow.logs.sentinels import SentinelScanner, clip_text
from alignflow.logs.steps import StepRecords

log = logging.getLogger(__name__)

FormatChoice = str
"""`"auto"` or the name of a registered log format (alignflow.logs.formats.FORMATS)."""
# The printed resolution of each column is read from the first RESOLUTION_SAMPLE step lines and every
# RESOLUTION_SAMPLE-th after: formats are fixed per framework version, and this keeps a 100k-step parse fast
# while still catching a run appended by another version.
RESOLUTION_SAMPLE = 50
# OpenMPI `mpirun --tag-output` writes `[1,3]<stdout>:` (job, rank), as MindFormers' mpirun launch merges ranks.
_RANK = re.compile(r"^(?:\[[A-Za-z_]*(\d+)\]:|\s*(\d+): |\[\d+,(\d+)\]<std(?:out|err)>:)")
# ANSI colour / cursor sequences (coloured loggers, `tee` of a terminal session): removed before reading.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


class _Bad:
    """A line that carries a step anchor but could not be read."""

    __slots__ = ("line_no", "rank", "reason", "text")

    def __init__(self, line_no: int, text: str, rank: int | None, reason: str) -> None:
        self.line_no, self.text, self.rank, self.reason = line_no, text, rank, reason


def parse_log(
    lines: Iterable[str], *, fmt: FormatChoice | LogFormatSpec = "auto", rank: int | None = None, source: str = "",
    first_interval: FirstIntervalChoice = "auto",
) -> ParsedLog:
    """Parse a MindFormers or Megatron training log into a frame indexed by step with canonical columns.

    `first_interval` (Megatron logs): `"auto"` recovers the per-iteration losses of the line that megatron-core
    >= 0.16 averages over each process's first iterations when the log shows that version (microsecond
    timestamps), `"deaverage"` does so whatever the timestamps say, `"raw"` keeps every value as printed;
    `ParsedLog.first_interval` records what was done and why.

    `fmt` may also be a declared format (`alignflow.logs.declared.regex_format`: a trainer's own step lines).

    Raises `LogParseError` when the log has no step lines (for the chosen rank), when it mixes both frameworks'
    step lines under `fmt="auto"`, or when `rank` names a rank that printed no step lines.
    """
    by_name = dict(FORMATS)
    name: str = fmt.name if isinstance(fmt, LogFormatSpec) else fmt
    if isinstance(fmt, LogFormatSpec):  # a declared format: read with it, the known ones still name stray lines
        by_name[fmt.name] = fmt
    if name != "auto" and name not in by_name:
        raise LogParseError(f"unknown log format {name!r}; use auto, {', '.join(FORMATS)}", source=source)
    if first_interval not in FIRST_INTERVAL_CHOICES:
        raise LogParseError(f"unknown first_interval {first_interval!r}; use {', '.join(FIRST_INTERVAL_CHOICES)}",
                            source=source)
    where = source or "log"
    read = _Pass(by_name, name, where)
    read.read(lines)
    fatal = [x for x in read.scanner.sentinels if x.fatal]
    hint = ""
    if fatal:
        hint = "; fatal line(s) found: " + "; ".join(f"{x.line_no}: {x.text}" for x in fatal[:3])
    chosen = _choose_format(name, read.steps, read.bad, where, hint, read.stage_formats, read.other_format_lines,
                            tuple(by_name.values()))
    rank_used = _choose_rank(read.steps[chosen], rank, read.not_last_stage, where, chosen, hint)
    parsed = _result(read, by_name[chosen], rank_used, first_interval, source, hint)
    log.debug("%s", parsed.summary())
    return parsed


class _Pass:
    """The one pass over a log's lines: step lines by format and rank, unreadable ones, sentinels and markers."""

    def __init__(self, by_name: dict[str, LogFormatSpec], name: str, where: str) -> None:
        self.by_name, self.where = by_name, where
        self.specs = tuple(FORMATS.values()) if name == "auto" else (by_name[name],)
        self.others = () if name == "auto" else tuple(spec for spec in FORMATS.values() if spec.name != name)
        self.scanner = SentinelScanner(all_rules(), all_markers())
        self.steps: dict[str, dict[int | None, StepRecords]] = {spec: {} for spec in by_name}
        self.bad: dict[str, list[_Bad]] = {spec: [] for spec in by_name}
        self.not_last_stage: dict[int | None, int] = {}
        self.stage_formats: set[str] = set()  # formats whose lines of a non-last pipeline stage (`loss: N/A`) came
        self.other_format_lines: dict[str, int] = {}  # step lines of formats not asked for (for the error message)
        self.line_no = self.n_step_lines = 0
        self.newline_seen, self.last_had_newline, self.last_step_text = False, True, ""
        # the last physical line, when it was a step line (read, or unreadable: `bad`): the next one may continue it
        self.pending: _Pending | None = None

    def read(self, lines: Iterable[str]) -> None:
        for self.line_no, raw in enumerate(lines, 1):
            self.last_had_newline = raw.endswith("\n")
            self.newline_seen = self.newline_seen or self.last_had_newline
            text = raw.rstrip("\r\n")
            if "\x1b" in text:
                text = _ANSI.sub("", text)
            prefix = _RANK.match(text)
            r: int | None = None
            if prefix is not None:
                r = int(prefix.group(1) or prefix.group(2) or prefix.group(3))
                text = text[prefix.end():]
            try:
                which, rec = self._step_line(text, r)
            except Exception as exc:  # a defect of this parser, never the log's fault: still no traceback
                raise LogParseError(f"internal parser error on this line ({type(exc).__name__}: {exc}); please "
                                    "report it with the line", source=self.where, line=self.line_no) from exc
            if rec is not None:
                self._add(which, rec, text, r)
        self.scanner.finish()

    def _step_line(self, text: str, r: int | None) -> tuple[str, StepLine | str | None]:
        """The format and reading of a step line; ("", None) for any other line, once its sentinels are read."""
        with_resolution = self.n_step_lines < RESOLUTION_SAMPLE or self.n_step_lines % RESOLUTION_SAMPLE == 0
        for spec in self.specs:
            if spec.is_step_line(text) and (rec := spec.parse_step(text, with_resolution)) is not None:
                return spec.name, rec
        pending, self.pending = self.pending, None
        if pending is not None and _join(pending, text, r, self.line_no, self.steps, self.bad, with_resolution,
                                         self.by_name):
            return "", None
        for other in self.others:
            if other.is_step_line(text) and other.parse_step(text, False) is not None:
                self.other_format_lines[other.name] = self.other_format_lines.get(other.name, 0) + 1
        self.scanner.feed(self.line_no, text, r)
        return "", None

    def _add(self, which: str, rec: StepLine | str, text: str, r: int | None) -> None:
        self.n_step_lines += 1
        self.pending = None
        continues = self.by_name[which].continues is not None
        if isinstance(rec, str):
            self.bad[which].append(_Bad(self.line_no, text, r, rec))
            if continues:
                self.pending = _Pending(which, r, text, not text.rstrip().endswith("|"), read=False)
            return
        if rec.glued:  # another process's output glued after the last field: its sentinels count
            self.scanner.feed(self.line_no, rec.glued, r)
        if rec.not_last_stage:
            self.not_last_stage[r] = self.not_last_stage.get(r, 0) + 1
            self.stage_formats.add(which)
            return
        self.last_step_text = text
        group = self.steps[which].get(r)
        if group is None:
            group = self.steps[which][r] = StepRecords(self.by_name[which].loss_columns)
        group.add(self.line_no, rec, text)
        if continues:
            self.pending = _Pending(which, r, text, rec.cut, read=True)


def _result(read: _Pass, spec: LogFormatSpec, rank_used: int | None, first_interval: FirstIntervalChoice,
            source: str, hint: str) -> ParsedLog:
    """The chosen format's and rank's step lines as the canonical frame, with every sentinel found."""
    by_rank = read.steps[spec.name]
    records = by_rank[rank_used] if rank_used in by_rank else StepRecords()
    counted_from = records.rebase_epochs()
    # An unterminated last line of a file that otherwise has newlines may be a line still being written. PyNative
    # lines show whether they are whole (`}`); a legacy line has no terminator, so one that does not end like a
    # whole line (`]` of global_norm, `T` of throughput) is left out. A Megatron line says itself whether it ends
    # inside a field (`drop_cut_ends` below): a copied log's last line may lack both its ` |` and a line end.
    sentinels = list(read.scanner.sentinels)
    if (read.newline_seen and not read.last_had_newline and len(records) and records.line_nos[-1] == read.line_no
            and spec.whole_line_ends is not None and not read.last_step_text.rstrip().endswith(spec.whole_line_ends)):
        sentinels.append(Sentinel(records.pop(), clip_text(read.last_step_text), "truncated_step_line", False,
                                  "the last line has no line end (log still being written?): ignored", rank_used))
    sentinels += [Sentinel(n, clip_text(text), "truncated_step_line", False, "step line cut short inside a field "
                           "before the log ended or restarted (the process was killed while it wrote it?): ignored",
                           rank_used) for n, text in records.drop_cut_ends()]
    if not len(records):
        raise LogParseError(f"no {spec.name} step lines for rank {rank_used}{hint}", source=source or "log")
    bad = [b for b in read.bad[spec.name] if b.rank == rank_used]
    sentinels += [records.classify_bad(b.line_no, b.text, b.reason, rank_used) for b in bad]
    outcome = None
    if spec.averages_first_interval:
        starts = ProcessStarts.from_lines(read.scanner.occurrences, ((b.line_no, b.text) for b in bad))
        outcome = deaverage(records, starts, mode=first_interval, rank=rank_used)
    built = records.build(rank_used, spec)
    sentinels += built.sentinels
    sentinels += near_misses(built.frame, built.line_numbers, spec, rank_used)
    if outcome is not None:
        outcome = outcome.kept(built.line_numbers.tolist())
        sentinels += outcome.warnings
    last_step = int(built.frame.index.max())
    if built.max_steps is not None and last_step < built.max_steps:
        sentinels.append(Sentinel(int(built.line_numbers.iloc[-1]), "", "incomplete_run", False,
                                  f"log ends at step {last_step} of {built.max_steps} (truncated, stopped early or "
                                  "still running)", rank_used))
    sentinels.sort(key=lambda x: x.line_no)
    ranks = sorted(r for r in {*by_rank, *read.not_last_stage} if r is not None)
    return ParsedLog(
        frame=built.frame, fmt=spec.name, variant=built.variant + (f" ({counted_from})" if counted_from else ""),
        resolution=built.resolution,
        sentinels=tuple(sentinels), repeated_steps=tuple(built.repeated_steps), restarts=tuple(built.restarts),
        line_numbers=built.line_numbers, source=source, rank=rank_used, ranks=tuple(ranks),
        max_steps=built.max_steps, markers=dict(read.scanner.markers), lines_read=read.line_no,
        first_interval=outcome.note if outcome is not None else None, gaps=built.gaps,
    )


class _Pending:
    """The last physical line when it was a step line, which the next physical line may continue."""

    __slots__ = ("cut", "fmt", "rank", "read", "text")

    def __init__(self, fmt: str, rank: int | None, text: str, cut: bool, *, read: bool) -> None:
        self.fmt, self.rank, self.text, self.cut, self.read = fmt, rank, text, cut, read


def _join(pending: _Pending, text: str, r: int | None, line_no: int,
          steps: dict[str, dict[int | None, StepRecords]], bad: dict[str, list[_Bad]],
          with_resolution: bool, by_name: dict[str, LogFormatSpec]) -> bool:
    """Read the pending step line again joined with `text`, the physical line after it, when `text` continues it
    (a document that wrapped the line, issue 33); True if it did."""
    spec = by_name[pending.fmt]
    if spec.continues is None or (r is not None and r != pending.rank):
        return False
    joined = spec.continues(pending.text, text, pending.cut)
    if joined is None:
        return False
    rec = spec.parse_step(joined, with_resolution)
    if not isinstance(rec, StepLine) or rec.not_last_stage:
        return False
    rec.note_not_read(f"line {line_no} continues this line (a line wrapped in two): read as one line")
    group = steps[pending.fmt].get(pending.rank)
    if pending.read and group is not None:
        group.replace_last(rec, joined)
        return True
    unreadable = bad[pending.fmt].pop()  # the line alone had no readable field
    if group is None:
        group = steps[pending.fmt][pending.rank] = StepRecords(spec.loss_columns)
    group.add(unreadable.line_no, rec, joined)
    return True


SNIFF_BYTES = 8192  # what is looked at to tell a binary file from a log


def parse_log_file(path: str | Path, **kwargs: object) -> ParsedLog:
    """Read `path` (UTF-8, undecodable bytes replaced) and parse it; `LogParseError` if it cannot be read."""
    p = Path(path)
    source = str(kwargs.pop("source", "") or p)
    try:
        with p.open("rb") as raw:
            head = raw.read(SNIFF_BYTES)
        if b"\0" in head:  # as git and grep tell binary files: a log is text (issue 45: a store.sqlite was compared)
            kind = " (an SQLite database)" if head.startswith(b"SQLite format 3\0") else ""
            raise LogParseError(f"not a text log: binary content{kind} (a NUL byte in its first "
                                f"{min(len(head), SNIFF_BYTES)} bytes)", source=source)
        with p.open("r", encoding="utf-8", errors="replace", newline="") as fh:
            return parse_log(fh, source=source, **kwargs)  # type: ignore[arg-type]
    except FileNotFoundError:
        raise LogParseError("file not found", source=source) from None
    except IsADirectoryError:
        raise LogParseError("is a directory, not a log file", source=source) from None
    except OSError as exc:
        raise LogParseError(f"cannot read: {exc.strerror or exc}", source=source) from None


def _choose_format(
    fmt: str, steps: dict[str, dict[int | None, StepRecords]],
    bad: dict[str, list[_Bad]], where: str, fatal_hint: str, stage_formats: set[str],
    other_lines: dict[str, int], formats: tuple[LogFormatSpec, ...],
) -> str:
    # Lines of a non-last pipeline stage (MindFormers' `loss: N/A`) identify the format even though they are dropped.
    found = [spec.name for spec in formats if steps[spec.name] or spec.name in stage_formats]
    if fmt != "auto":
        asked = next((spec.name for spec in formats if spec.name == fmt), None)
        if asked in found:
            return asked
        hint = "".join(f"; it has {n} {other} step line(s): use format auto or {other}"
                       for other, n in other_lines.items())
        unread = bad[asked] if asked is not None else []
        first_bad = unread[0].line_no if unread else None
        raise LogParseError(f"no {fmt} step lines{_bad_hint(unread)}{hint}{fatal_hint}", source=where,
                            line=first_bad)
    if not found:
        anchors = next((b for b in bad.values() if b), [])
        seen = [f"{spec.label} {spec.anchor}".rstrip() for spec in formats]
        raise LogParseError(
            f"no step lines (neither {', '.join(seen[:-1])} nor {seen[-1]}){_bad_hint(anchors)}; is this the "
            f"last pipeline stage's training log?{fatal_hint}", source=where,
            line=anchors[0].line_no if anchors else None)
    if len(found) > 1:
        first = {k: min((group.line_nos[0] for group in steps[k].values()), default=0) for k in found}
        labels = {spec.name: spec.label for spec in formats}
        each = [f"{labels[k]} (first at line {first[k]})" for k in found]
        which = f"both {each[0]} and {each[1]}" if len(each) == 2 else ", ".join(each[:-1]) + f" and {each[-1]}"
        raise LogParseError(f"{which} step lines; choose one with format {' or '.join(found)}", source=where)
    return found[0]


def _bad_hint(bad: list[_Bad]) -> str:
    if not bad:
        return ""
    return f" ({len(bad)} unreadable step line(s), first at line {bad[0].line_no}: {bad[0].reason})"


def _choose_rank(
    by_rank: dict[int | None, StepRecords], rank: int | None, not_last_stage: dict[int | None, int],
    where: str, fmt: str, fatal_hint: str,
) -> int | None:
    with_steps = sorted(r for r in by_rank if r is not None)
    if rank is not None:
        if rank in by_rank:
            return rank
        if not with_steps and None in by_rank:
            raise LogParseError(f"rank {rank} requested but the lines carry no rank prefix; pass that rank's own "
                                f"log (e.g. worker_{rank}.log)", source=where)
        detail = " (it printed only `loss: N/A`: not the last pipeline stage)" if rank in not_last_stage else ""
        ranks = ", ".join(str(r) for r in with_steps) or "none"
        raise LogParseError(f"rank {rank} printed no {fmt} step lines with a loss{detail}; ranks with step lines: "
                            f"{ranks}", source=where)
    if with_steps:
        return with_steps[-1]
    if None in by_rank:
        return None
    stages = sum(not_last_stage.values())
    raise LogParseError(f"only non-last pipeline stage lines ({stages} with `loss: N/A`); parse the last stage's "
                        f"log (its worker_<rank>.log){fatal_hint}", source=where)
