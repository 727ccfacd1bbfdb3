"""`write_report`: a comparison as files — a self-contained HTML report, a markdown summary, CSV, PNGs, JSON.

The only module of the comparison that writes files. The HTML embeds its plots (base64) and its style, so one
file can be attached to a ticket or served as a Prefect artifact link; the markdown summary is what a Prefect
markdown artifact shows; the CSV holds every step of either log (aligned, with errors) for anyone who wants to
re-plot; `comparison.json` is the `alignflow compare --json` document. Each file is written to a temporary
name and renamed, so a reader never sees half a report.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd

from alignflow.compare.comparison import Comparison, CriterionResult
from alignflow.compare.criteria import RELATIVE_STATISTICS
from alignflow.compare.formatting import fmt_number, fmt_percent, fmt_stat, step_ranges
from alignflow.logs.schema import ParsedLog, Sentinel

log = logging.getLogger(__name__)

HTML_NAME, MARKDOWN_NAME, CSV_NAME, JSON_NAME = "report.html", "summary.md", "aligned.csv", "comparison.json"
MAX_SENTINEL_ROWS_HTML = 500
MAX_SENTINEL_ROWS_MD = 10
STAT_COLUMNS = ("me", "mean_abs", "max_error", "min_error", "max_abs", "mean_rel", "max_rel")
Table = tuple[list[str], list[list[str]]]


@dataclass(frozen=True, slots=True)
class ReportFiles:
    """Paths of the files `write_report` wrote."""

    html: Path
    markdown: Path
    csv: Path
    json: Path
    pngs: dict[str, Path] = field(default_factory=dict)


def write_report(
    comparison: Comparison, out_dir: str | Path, *, title: str = "alignflow comparison",
    labels: tuple[str, str] = ("test", "reference"), fingerprints: Mapping[str, Any] | None = None,
    plots: bool = True,
) -> ReportFiles:
    """Write the report files of `comparison` into `out_dir` (created if needed) and return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, bytes] = {}
    if plots and comparison.metrics:
        from alignflow.compare.plots import metric_pngs

        pngs = metric_pngs(comparison, labels=labels)
    png_paths: dict[str, Path] = {}
    for metric, data in pngs.items():
        from alignflow.compare.plots import png_name

        png_paths[metric] = _atomic_write(out / png_name(metric), data)
    csv_path = _atomic_write(out / CSV_NAME, aligned_csv(comparison.aligned).encode())
    json_doc = comparison.to_json()
    if fingerprints:
        json_doc["fingerprints"] = dict(fingerprints)
    json_path = _atomic_write(out / JSON_NAME, json.dumps(json_doc, indent=2, default=str).encode())
    md_path = _atomic_write(out / MARKDOWN_NAME, markdown_summary(
        comparison, title=title, labels=labels, fingerprints=fingerprints,
        png_names=[p.name for p in png_paths.values()]).encode())
    html_path = _atomic_write(out / HTML_NAME, html_report(
        comparison, title=title, labels=labels, fingerprints=fingerprints, pngs=pngs).encode())
    log.info("report written to %s (verdict %s)", out, comparison.verdict)
    return ReportFiles(html=html_path, markdown=md_path, csv=csv_path, json=json_path, pngs=png_paths)


def aligned_csv(aligned: pd.DataFrame) -> str:
    """The aligned frame as CSV: `step`, then every column; flags as 0/1, values to 12 significant digits, a
    missing value as `nan`.

    Why not `DataFrame.to_csv`: it formats each cell through Python objects and takes ~3x longer, which at
    100,000 steps is most of the report's budget; one `%`-format per row does the same job in C.
    """
    columns = list(aligned.columns)
    data = [aligned[c].to_numpy(dtype=float).tolist() for c in columns]
    fmt = ",".join(["%d"] + ["%d" if aligned[c].dtype == bool else "%.12g" for c in columns])
    header = ",".join(["step", *columns])
    body = "\n".join([fmt % row for row in zip(aligned.index.tolist(), *data, strict=True)])
    return header + "\n" + body + "\n"


def _atomic_write(path: Path, data: bytes) -> Path:
    # A unique sibling opened normally (not mkstemp, whose 0600 mode would make reports unreadable to others).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("xb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# ---- the report's tables, shared by markdown and HTML ------------------------------------------------------

def criteria_table(comparison: Comparison) -> Table:
    rows = []
    for r in comparison.criteria:
        rows.append([r.criterion.label, _criterion_value(comparison, r), _threshold(r),
                     "PASS" if r.passed else "FAIL", r.note, r.criterion.source or ""])
    return ["criterion", "value", "threshold", "result", "note", "source"], rows


def _criterion_value(comparison: Comparison, r: CriterionResult) -> str:
    mc = comparison.metrics.get(r.metric)
    return fmt_stat(r.value, r.statistic, mc.resolution if mc else None, mc.magnitude if mc else None)


def _threshold(r: CriterionResult) -> str:
    if r.statistic in RELATIVE_STATISTICS:
        return f"{r.threshold * 100:g}%"
    return f"{r.threshold:g}"


def metrics_table(comparison: Comparison) -> Table:
    header = ["metric", "n", "ME", "mean |e|", "max e", "min e", "max |e| (step)", "mean rel", "max rel (step)",
              "step rel", "resolution"]
    rows = []
    for m, mc in comparison.metrics.items():
        s, q, mag = mc.stats, mc.resolution, mc.magnitude
        vals = {k: fmt_stat(s.get(k), k, q, mag) for k in STAT_COLUMNS}
        step_rel = ", ".join(f"{k}: {fmt_stat(v, 'step_rel', q, mag)}" for k, v in mc.step_rel.items())
        note = mc.resolution_text + (f"; reference shifted {mc.shift:+d} step" if mc.shift else "")
        if mc.not_compared:
            note += f"; {mc.not_compared} common step(s) without a finite value on a side"
        rows.append([m, str(s.n), vals["me"], vals["mean_abs"], vals["max_error"], vals["min_error"],
                     f"{vals['max_abs']} ({s.max_abs_step})", vals["mean_rel"], f"{vals['max_rel']} ({s.max_rel_step})",
                     step_rel, note])
    return header, rows


def perplexity_table(comparison: Comparison, labels: tuple[str, str]) -> Table:
    rows = [[m, fmt_number(mc.perplexity.test, 6), fmt_number(mc.perplexity.reference, 6),
             fmt_percent(mc.perplexity.rel_error), fmt_number(mc.perplexity.test_final, 6),
             fmt_number(mc.perplexity.reference_final, 6)]
            for m, mc in comparison.metrics.items() if mc.perplexity is not None]
    return ["metric", f"ppl {labels[0]} (mean loss)", f"ppl {labels[1]} (mean loss)", "change",
            f"ppl {labels[0]} (last step)", f"ppl {labels[1]} (last step)"], rows


def performance_table(comparison: Comparison, labels: tuple[str, str]) -> Table:
    p = comparison.performance
    rows = []
    for label, side in ((labels[0], p.test), (labels[1], p.reference)):
        if side is None:
            rows.append([label, "no step time in the log", "", "", "", "", ""])
            continue
        rows.append([label, f"{side.steps} (after {side.warmup_steps} warm-up)", fmt_number(side.ms_per_iter_mean, 6),
                     fmt_number(side.ms_per_iter_p95, 6), fmt_number(side.ms_per_iter_p99, 6),
                     fmt_number(side.global_batch_size, 6), fmt_number(side.samples_per_s, 6)])
    return ["side", "steps measured", "ms/iter mean", "P95", "P99", "global batch", "samples/s"], rows


def inputs_table(comparison: Comparison, labels: tuple[str, str]) -> Table:
    rows = []
    for label, parsed in ((labels[0], comparison.test), (labels[1], comparison.reference)):
        rows.append([label, parsed.source, f"{parsed.fmt} ({parsed.variant})",
                     "" if parsed.rank is None else str(parsed.rank), _span(parsed),
                     step_ranges(parsed.repeated_steps, 10) if parsed.repeated_steps else "none",
                     "; ".join(f"line {r.line_no}: step {r.from_step} -> {r.to_step}" for r in parsed.restarts[:5])
                     or "none", _deaveraged_steps(parsed)])
    return ["side", "log", "format", "rank", "steps", "repeated steps (last kept)", "restarts",
            "de-averaged steps"], rows


def _deaveraged_steps(parsed: ParsedLog) -> str:
    if parsed.first_interval is None:
        return "n/a"
    return step_ranges(parsed.first_interval.corrected_steps, 10) if parsed.first_interval.corrected_steps else "none"


def first_interval_lines(comparison: Comparison, labels: tuple[str, str]) -> list[str]:
    """What each Megatron side's parse did with the first printed interval (megatron-core >= 0.16 averaging)."""
    return [f"{label}: {parsed.first_interval.describe()}"
            for label, parsed in ((labels[0], comparison.test), (labels[1], comparison.reference))
            if parsed.first_interval is not None and parsed.first_interval.intervals]


def _span(parsed: ParsedLog) -> str:
    if parsed.frame.empty:
        return "none"
    of = f" of {parsed.max_steps}" if parsed.max_steps else ""
    return f"{len(parsed.frame)} ({parsed.frame.index.min()}-{parsed.frame.index.max()}{of})"


def sentinel_table(found: Sequence[Sentinel], limit: int) -> Table:
    rows = [[str(s.line_no), "" if s.rank is None else str(s.rank), s.kind, "FATAL" if s.fatal else "warn",
             s.message, s.text] for s in found[:limit]]
    if len(found) > limit:
        rows.append(["...", "", "", "", f"{len(found) - limit} more (see comparison.json)", ""])
    return ["line", "rank", "kind", "severity", "meaning", "text"], rows


def fingerprint_table(fingerprints: Mapping[str, Any]) -> Table:
    rows = [[key, str(value)] for key, value in _flatten(fingerprints)]
    return ["input", "sha256 / fingerprint"], rows


def _flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += _flatten(value, name + ".")
        else:
            out.append((name, value))
    return out


def coverage_lines(comparison: Comparison, labels: tuple[str, str]) -> list[str]:
    st = comparison.steps
    lines = [f"compared: {st.compared} step(s)" + (f" ({st.first}-{st.last})" if st.compared else ""),
             f"only in {labels[0]}: {step_ranges(st.only_test)}",
             f"only in {labels[1]}: {step_ranges(st.only_reference)}"]
    if comparison.metrics_only_test:
        lines.append(f"metrics only in {labels[0]}: {', '.join(comparison.metrics_only_test)}")
    if comparison.metrics_only_reference:
        lines.append(f"metrics only in {labels[1]}: {', '.join(comparison.metrics_only_reference)}")
    return lines


# ---- markdown ---------------------------------------------------------------------------------------------

def _md_table(table: Table) -> str:
    header, rows = table

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def markdown_summary(
    comparison: Comparison, *, title: str, labels: tuple[str, str] = ("test", "reference"),
    fingerprints: Mapping[str, Any] | None = None, png_names: Sequence[str] = (),
) -> str:
    """The summary a Prefect markdown artifact shows: verdict, criteria, metrics, steps, sentinels, speed."""
    parts = [f"# {title}", "", f"**Verdict: {comparison.verdict.upper()}** — {labels[0]} vs {labels[1]}", ""]
    parts += [f"- {r}" for r in comparison.reasons] + ([""] if comparison.reasons else [])
    parts += ["## Criteria", "", _md_table(criteria_table(comparison)), ""]
    if comparison.metrics:
        parts += ["## Metrics (error = " + f"{labels[0]} - {labels[1]})", "", _md_table(metrics_table(comparison)), ""]
        ppl = perplexity_table(comparison, labels)
        if ppl[1]:
            parts += [_md_table(ppl), ""]
    parts += ["## Steps", ""] + [f"- {line}" for line in coverage_lines(comparison, labels)] + [""]
    parts += ["## Sentinels", ""]
    for label, side in ((labels[0], "test"), (labels[1], "reference")):
        found = comparison.sentinels[side]
        fatal = sum(s.fatal for s in found)
        parts.append(f"**{label}**: {len(found)} line(s), {fatal} fatal")
        if found:
            parts += ["", _md_table(sentinel_table(found, MAX_SENTINEL_ROWS_MD))]
        parts.append("")
    parts += ["## Performance", "", _md_table(performance_table(comparison, labels)), ""]
    change = comparison.performance.throughput_change
    if change is not None:
        parts += [f"Throughput change ({labels[0]} vs {labels[1]}): {fmt_percent(change)}", ""]
    parts += ["## Inputs", "", _md_table(inputs_table(comparison, labels)), ""]
    first = first_interval_lines(comparison, labels)
    if first:
        parts += ["Megatron first interval (megatron-core >= 0.16 averages each run's first printed iteration into "
                  "its next line):", ""] + [f"- {line}" for line in first] + [""]
    if fingerprints:
        parts += [_md_table(fingerprint_table(fingerprints)), ""]
    if png_names:
        parts += ["Plots: " + ", ".join(png_names), ""]
    return "\n".join(parts)


# ---- HTML -------------------------------------------------------------------------------------------------

def _html_table(table: Table, *, result_column: str | None = None) -> str:
    header, rows = table
    col = header.index(result_column) if result_column in header else -1
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            cls = f' class="{c.lower()}"' if i == col and c in ("PASS", "FAIL", "FATAL", "warn") else ""
            cells.append(f"<td{cls}>{html.escape(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def html_report(
    comparison: Comparison, *, title: str, labels: tuple[str, str] = ("test", "reference"),
    fingerprints: Mapping[str, Any] | None = None, pngs: Mapping[str, bytes] | None = None,
) -> str:
    """One self-contained HTML page: style and plots inline, nothing fetched."""
    e = html.escape
    body = [f"<h1>{e(title)}</h1>",
            f'<p class="verdict {comparison.verdict}">Verdict: {comparison.verdict.upper()}</p>',
            f"<p>{e(labels[0])} vs {e(labels[1])}; error = {e(labels[0])} - {e(labels[1])}</p>"]
    if comparison.reasons:
        body.append("<ul>" + "".join(f"<li>{e(r)}</li>" for r in comparison.reasons) + "</ul>")
    body += ["<h2>Criteria</h2>", _html_table(criteria_table(comparison), result_column="result")]
    if comparison.metrics:
        body += ["<h2>Metrics</h2>", _html_table(metrics_table(comparison))]
        ppl = perplexity_table(comparison, labels)
        if ppl[1]:
            body.append(_html_table(ppl))
    body += ["<h2>Steps</h2>", "<ul>" + "".join(f"<li>{e(x)}</li>" for x in coverage_lines(comparison, labels))
             + "</ul>", "<h2>Sentinels</h2>"]
    for label, side in ((labels[0], "test"), (labels[1], "reference")):
        found = comparison.sentinels[side]
        body.append(f"<h3>{e(label)}: {len(found)} line(s), {sum(s.fatal for s in found)} fatal</h3>")
        if found:
            body.append(_html_table(sentinel_table(found, MAX_SENTINEL_ROWS_HTML), result_column="severity"))
    body += ["<h2>Performance</h2>", _html_table(performance_table(comparison, labels))]
    if comparison.performance.throughput_change is not None:
        body.append(f"<p>Throughput change: {e(fmt_percent(comparison.performance.throughput_change))}</p>")
    body += ["<h2>Inputs</h2>", _html_table(inputs_table(comparison, labels))]
    first = first_interval_lines(comparison, labels)
    if first:
        body.append("<p>Megatron first interval (megatron-core &gt;= 0.16 averages each run's first printed iteration "
                    "into its next line):</p><ul>" + "".join(f"<li>{e(x)}</li>" for x in first) + "</ul>")
    if fingerprints:
        body.append(_html_table(fingerprint_table(fingerprints)))
    if pngs:
        body.append("<h2>Plots</h2>")
        for metric, data in pngs.items():
            encoded = base64.b64encode(data).decode("ascii")
            body.append(f'<figure><img alt="{e(metric)}" src="data:image/png;base64,{encoded}">'
                        f"<figcaption>{e(metric)}</figcaption></figure>")
    template = Template(resources.files("alignflow.compare").joinpath("report.html").read_text(encoding="utf-8"))
    return template.substitute(title=e(title), body="\n".join(body))
