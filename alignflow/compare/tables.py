"""The tables of a report, shared by the HTML page, the markdown summary and the CLI: one source of every cell,
so a criterion's value and unit read the same wherever it is shown.

A report covers one reference log and one or more test logs (`Comparison`s that share the reference); with
several tests each table gets a `log` column. `labels` are the tests' names then the reference's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from alignflow.compare.context import FingerprintRow, ReportContext, environment_rows
from alignflow.compare.formatting import (
    criterion_label,
    fmt_duration,
    fmt_number,
    fmt_percent,
    fmt_size,
    fmt_stat,
    fmt_threshold,
    step_ranges,
)
from alignflow.config.statistics import STATISTICS

if TYPE_CHECKING:  # the run summary's metric cells (metric_cells) are read without pandas: ~0.3 s of every run
    from alignflow.compare.comparison import Comparison
    from alignflow.logs.schema import ParsedLog, Sentinel



@dataclass(frozen=True, slots=True)
class Table:
    """Header, rows of text cells, a CSS class per row ('' for none) and footnotes."""

    header: list[str]
    rows: list[list[str]]
    row_classes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _tests(comparisons: Sequence[Comparison], labels: Sequence[str]) -> list[tuple[str, Comparison]]:
    return list(zip(labels[:-1], comparisons, strict=True))


def _with_log(multi: bool, label: str, row: list[str]) -> list[str]:
    return [label, *row] if multi else row


def criteria_table(comparisons: Sequence[Comparison], labels: Sequence[str]) -> Table:
    multi = len(comparisons) > 1
    header = _with_log(multi, "log", ["criterion", "value", "threshold", "result", "diverges at",
                                      "driving steps", "note", "source"])
    rows, classes = [], []
    for label, c in _tests(comparisons, labels):
        for r in c.criteria:
            rows.append(_with_log(multi, label, [
                criterion_label(r.criterion), r.value_text or fmt_stat(r.value, r.statistic, None),
                fmt_threshold(r.criterion), r.status.upper() if r.evaluated else r.status,
                "" if r.first_outside is None else str(r.first_outside),
                ", ".join(str(d.step) for d in r.drivers), r.note, r.criterion.source or ""]))
            classes.append("" if r.passed or not r.evaluated else "failed")
    return Table(header, rows, classes)


def failed_lines(comparisons: Sequence[Comparison], labels: Sequence[str]) -> list[str]:
    """The verdict's reasons, each failed criterion with the steps that drive it (the report's first lines)."""
    multi = len(comparisons) > 1
    return [f"{label}: {reason}" if multi else reason
            for label, c in _tests(comparisons, labels) for reason in c.reasons]


def divergence_lines(comparisons: Sequence[Comparison], labels: Sequence[str]) -> list[str]:
    """Per test log, every compared metric by where its error stands against its band (the band the figures shade,
    `MetricComparison.band`): the first step outside it; inside at every step; inside at every step yet failing a
    criterion (an average can fail where no single step leaves the per-step band, e.g. under a noise floor); no
    band at all. A metric is named in exactly one of these, so no sentence contradicts a panel or a criterion."""
    multi = len(comparisons) > 1
    out = []
    for label, c in _tests(comparisons, labels):
        failing: dict[str, list[str]] = {}
        for r in c.criteria:
            if r.evaluated and not r.passed:
                failing.setdefault(r.metric, []).append(criterion_label(r.criterion))
        outside, inside, inside_failing, unbanded = [], [], [], []
        for m, mc in c.metrics.items():
            d = mc.divergence
            if d is None or d.judged_steps == 0:
                unbanded.append(f"{m} ({d.basis if d else 'no steps compared'})")
            elif d.first_step is not None:
                basis = "" if d.own_criteria else f"; band: {d.basis}"
                outside.append(f"{m} at step {d.first_step} ({d.steps_outside} step(s) outside, worst "
                               f"{d.worst_step}{basis})")
            elif m in failing:
                inside_failing.append(f"{m} ({', '.join(failing[m])} failed)")
            else:
                inside.append(m)
        parts = []
        if outside:
            parts.append("first outside its band: " + "; ".join(outside))
        if inside_failing:
            parts.append("inside its per-step band at every step but failing a criterion over the run: "
                         + "; ".join(inside_failing))
        if inside and (outside or inside_failing or unbanded):
            parts.append(f"inside its band at every step: {', '.join(inside)}")
        elif inside:
            parts.append("every metric stays inside its band")
        if unbanded:
            parts.append(f"no band to judge it by: {'; '.join(unbanded)}")
        text = "; ".join(parts) if parts else "no metric compared"
        out.append(f"{label}: {text}" if multi else text)
    return out


def metric_header() -> list[str]:
    """The metrics table's header: each registered statistic's heading (an extreme's step after it), those at chosen
    steps after those over the run."""
    over_run = [h for s in STATISTICS.values() if s.reduce != "at_steps"
                for h in (s.heading, "at step")[:2 if s.shows_step else 1]]
    return ["metric", "n", *over_run, *(s.heading for s in STATISTICS.values() if s.reduce == "at_steps"),
            "diverges at", "resolution"]


def metrics_table(comparisons: Sequence[Comparison], labels: Sequence[str]) -> Table:
    multi = len(comparisons) > 1
    header = _with_log(multi, "log", metric_header())
    rows, notes = [], []
    for label, c in _tests(comparisons, labels):
        for m, mc in c.metrics.items():
            rows.append(_with_log(multi, label, metric_cells(m, mc.to_json())))
            note = f"{m}: {mc.resolution_text}" + (f"; reference shifted {mc.shift:+d} step" if mc.shift else "")
            if mc.not_compared:
                note += f"; {mc.not_compared} common step(s) without a finite value on a side"
            notes.append(f"{label}: {note}" if multi else note)
    notes = list(dict.fromkeys(notes))
    return Table(header, rows, notes=["resolution = one unit of the coarser log's last printed digit; "
                                      "relative values in %", *notes])


def metric_cells(metric: str, doc: Mapping[str, Any]) -> list[str]:
    """One metric's row of the metrics table (`metric_header()`), from its recorded statistics
    (`MetricComparison.to_json()`, as the store keeps them): the report, the CLI and the Prefect table artifact
    all write these cells."""
    q, mag = doc.get("resolution"), doc.get("magnitude")
    over_run = [cell for s in STATISTICS.values() if s.reduce != "at_steps"
                for cell in (fmt_stat(doc.get(s.name), s.name, q, mag), _step(doc.get(f"{s.name}_step")))
                [:2 if s.shows_step else 1]]
    at_steps = [", ".join(f"{k}: {fmt_stat(x, s.name, q, mag)}" for k, x in (doc.get(s.name) or {}).items())
                for s in STATISTICS.values() if s.reduce == "at_steps"]
    first = (doc.get("divergence") or {}).get("first_step")
    return [metric, str(doc.get("n", "")), *over_run, *at_steps, _step(first), f"{q:.3g}" if q else "unknown"]


def _step(value: Any) -> str:
    return "" if value is None else str(value)


def perplexity_table(comparisons: Sequence[Comparison], labels: Sequence[str]) -> Table:
    multi = len(comparisons) > 1
    rows = []
    for label, c in _tests(comparisons, labels):
        rows += [_with_log(multi, label, [
            m, fmt_number(mc.perplexity.test, 6), fmt_number(mc.perplexity.reference, 6),
            fmt_percent(mc.perplexity.rel_error), fmt_number(mc.perplexity.test_final, 6),
            fmt_number(mc.perplexity.reference_final, 6)])
            for m, mc in c.metrics.items() if mc.perplexity is not None]
    test = "test" if multi else labels[0]
    return Table(_with_log(multi, "log", ["metric", f"ppl {test} (mean loss)", f"ppl {labels[-1]} (mean loss)",
                                          "change", f"ppl {test} (last step)", f"ppl {labels[-1]} (last step)"]),
                 rows)


def performance_table(comparisons: Sequence[Comparison], labels: Sequence[str],
                      context: ReportContext | None = None) -> Table:
    """Each side's step-time figures; the notes say how each side was timed (`context.timing`, when the run
    recorded it) and which is faster — or why no ratio is given (`performance.speed_summary`)."""
    rows = []
    sides = [(labels[-1], comparisons[0].performance.reference)]
    sides += [(label, c.performance.test) for label, c in _tests(comparisons, labels)]
    for label, side in sides:
        if side is None:
            rows.append([label, "no step time in the log", "", "", "", "", "", ""])
            continue
        rows.append([label, str(side.steps), str(side.warmup_steps), fmt_number(side.ms_per_iter_mean, 5),
                     fmt_number(side.ms_per_iter_p95, 5), fmt_number(side.ms_per_iter_p99, 5),
                     fmt_number(side.global_batch_size, 6), fmt_number(side.samples_per_s, 5)])
    from alignflow.compare.performance import speed_summary

    timing = context.timing if context is not None else {}
    notes = [f"{label} timed: {timing[label].describe()}" for label in (labels[-1], *labels[:-1]) if label in timing]
    notes += [speed_summary(c.performance, (label, labels[-1]), timing) for label, c in _tests(comparisons, labels)]
    return Table(["side", "steps measured", "warm-up steps left out", "mean (ms/iter)", "P95 (ms/iter)",
                  "P99 (ms/iter)", "global batch (samples)", "throughput (samples/s)"], rows,
                 notes=[n for n in notes if n])


def memory_table(comparisons: Sequence[Comparison], labels: Sequence[str]) -> Table:
    """Each side's memory per rank as seed 004 reports it (its peak per rank, max-rank, avg-rank), MiB; the notes
    give each test's change against the reference, or why there is none. No rows: neither log reports memory."""
    sides = [(labels[-1], comparisons[0].memory.reference)]
    sides += [(label, c.memory.test) for label, c in _tests(comparisons, labels)]
    rows = []
    for label, m in sides:
        if m is None:
            rows.append([label, "no memory report in the log", "", "", "", ""])
            continue
        per_rank = ", ".join(f"{r}: {v:.2f}" for r, v in m.per_rank)
        rows.append([label, f"{m.metric.removesuffix('_mb')} ({', '.join(m.sources)})", per_rank,
                     f"{m.max_rank:.2f} (rank {m.peak_rank})", f"{m.avg_rank:.2f}", str(len(m.per_rank))])
    if all(m is None for _, m in sides):
        return Table([], [])
    notes = []
    for label, c in _tests(comparisons, labels):
        change = c.memory.change
        if change is None:
            notes.append(f"{label} vs {labels[-1]}: no memory change ({c.memory.why_not()})")
        else:
            notes.append(f"{label} vs {labels[-1]}: max-rank {-change.max_rank_saving:+.2f}%, avg-rank "
                         f"{-change.avg_rank_saving:+.2f}% (seed 004's saving: {change.max_rank_saving:.2f}% / "
                         f"{change.avg_rank_saving:.2f}%)")
    return Table(["side", "measure", "peak per rank (MiB)", "max-rank (MiB)", "avg-rank (MiB)", "ranks"], rows,
                 notes=notes)


def inputs_table(comparisons: Sequence[Comparison], labels: Sequence[str]) -> Table:
    rows = []
    logs = [(labels[-1], comparisons[0].reference)] + [(label, c.test) for label, c in _tests(comparisons, labels)]
    for label, parsed in logs:
        rows.append([label, parsed.source, f"{parsed.fmt} ({parsed.variant})",
                     "" if parsed.rank is None else str(parsed.rank), _span(parsed),
                     step_ranges(parsed.repeated_steps, 10) if parsed.repeated_steps else "none",
                     "; ".join(f"line {r.line_no}: step {r.from_step} -> {r.to_step}" for r in parsed.restarts[:5])
                     or "none", _deaveraged_steps(parsed)])
    notes = [rank_note(label, parsed.rank, parsed.ranks) for label, parsed in logs if parsed.rank is not None]
    return Table(["side", "log", "format", "rank", "steps", "repeated steps (last kept)", "restarts",
                  "de-averaged steps"], rows, notes=notes)


def rank_note(label: str, rank: int | None, ranks: Sequence[int]) -> str:
    """Which rank of a multi-process (rank-prefixed) log is compared, and why that one."""
    others = f" (ranks with step lines: {', '.join(map(str, ranks))})" if len(ranks) > 1 else ""
    return (f"{label}: rank {rank} of this multi-process log is compared{others} - the highest rank that printed "
            "losses, i.e. the last pipeline stage: Megatron prints the loss only there, MindFormers prints "
            "`loss: N/A` on the other stages. Every rank's lines are scanned for sentinels.")


def fingerprint_table(rows: Sequence[FingerprintRow]) -> Table:
    return Table(["input / output", "step", "sha256", "size", "where"],
                 [[r.name, r.step, r.sha256, fmt_size(r.size_bytes), r.where] for r in rows])


def fingerprint_rows(fingerprints: Mapping[str, Any] | None, context: ReportContext | None) -> list[FingerprintRow]:
    """The context's fingerprints, then any plain `name -> sha256` ones not already listed."""
    out = list(context.fingerprints) if context else []
    known = {(r.name, r.sha256) for r in out}
    for key, value in _flatten(fingerprints or {}):
        if (key, str(value)) not in known:
            out.append(FingerprintRow(key, str(value)))
    return out


def steps_table(context: ReportContext) -> Table:
    rows = [[s.step, s.status, s.host or "", fmt_duration(s.duration_s),
             "" if s.exit_code is None else str(s.exit_code), s.note] for s in context.steps]
    return Table(["step", "status", "host", "duration", "exit", "note"], rows,
                 [f"status-{s.status}" for s in context.steps])


def environment_tables(context: ReportContext) -> tuple[Table, Table]:
    """(the settings that differ between the sides, those that agree), one column per side."""
    sides = list(context.snapshots)
    header = ["setting", *[f"{side} ({context.snapshots[side].get('host', '?')})" for side in sides]]
    rows = environment_rows(context.snapshots)
    differ = [r for r in rows if r.differs]
    same = [r for r in rows if not r.differs]
    return (Table(header, [[r.key, *r.values] for r in differ], ["diff"] * len(differ)),
            Table(header, [[r.key, *r.values] for r in same]))


def sentinel_table(found: Sequence[Sentinel], limit: int) -> Table:
    rows = [[str(s.line_no), "" if s.rank is None else str(s.rank), s.kind, "FATAL" if s.fatal else "warn",
             s.message, s.text] for s in found[:limit]]
    if len(found) > limit:
        rows.append(["...", "", "", "", f"{len(found) - limit} more (see comparison.json)", ""])
    return Table(["line", "rank", "kind", "severity", "meaning", "text"], rows,
                 ["failed" if s.fatal else "" for s in found[:limit]])


def sentinel_logs(comparisons: Sequence[Comparison], labels: Sequence[str]) -> list[tuple[str, tuple[Sentinel, ...]]]:
    return [(labels[-1], comparisons[0].reference.sentinels)] + [
        (label, c.test.sentinels) for label, c in _tests(comparisons, labels)]


def coverage_lines(comparisons: Sequence[Comparison], labels: Sequence[str]) -> list[str]:
    lines = []
    for label, c in _tests(comparisons, labels):
        st = c.steps
        lines += [f"{label} vs {labels[-1]}: compared {st.compared} step(s)"
                  + (f" ({st.first}-{st.last})" if st.compared else ""),
                  f"only in {label}: {step_ranges(st.only_test)}",
                  f"only in {labels[-1]}: {step_ranges(st.only_reference)}"]
        if st.excluded:  # issue 15: skipped steps left out, gaps inside the compared range
            lines.append(f"left out of the statistics (skipped): {step_ranges(st.excluded)}")
        lines += [f"gap in {label if side == 'test' else labels[-1]}: steps {a}-{b}"
                  for side, gaps in st.gaps.items() for a, b in gaps]
        if c.metrics_only_test:
            lines.append(f"metrics only in {label}: {', '.join(c.metrics_only_test)}")
        if c.metrics_only_reference:
            lines.append(f"metrics only in {labels[-1]}: {', '.join(c.metrics_only_reference)}")
    return list(dict.fromkeys(lines))


def first_interval_lines(comparisons: Sequence[Comparison], labels: Sequence[str]) -> list[str]:
    """What each Megatron side's parse did with the first printed interval (megatron-core >= 0.16 averaging)."""
    logs = [(labels[-1], comparisons[0].reference)] + [(label, c.test) for label, c in _tests(comparisons, labels)]
    return [f"{label}: {parsed.first_interval.describe()}" for label, parsed in logs
            if parsed.first_interval is not None and parsed.first_interval.intervals]


def restart_lines(comparisons: Sequence[Comparison], labels: Sequence[str]) -> list[str]:
    """Where a side's log holds more than one run (a restart, or a run appended to it) and which run is compared."""
    logs = [(labels[-1], comparisons[0].reference)] + [(label, c.test) for label, c in _tests(comparisons, labels)]
    return [f"{label}: line {s.line_no}: {s.message}" for label, parsed in logs for s in parsed.sentinels
            if s.kind == "restart"]


def _deaveraged_steps(parsed: ParsedLog) -> str:
    if parsed.first_interval is None:
        return "n/a"
    return step_ranges(parsed.first_interval.corrected_steps, 10) if parsed.first_interval.corrected_steps else "none"


def _span(parsed: ParsedLog) -> str:
    if parsed.frame.empty:
        return "none"
    of = f" of {parsed.max_steps}" if parsed.max_steps else ""
    return f"{len(parsed.frame)} ({parsed.frame.index.min()}-{parsed.frame.index.max()}{of})"


def _flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _flatten(value, name + ".")
        else:
            out.append((name, value))
    return out
