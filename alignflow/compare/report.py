"""`write_report`: a comparison as files — a self-contained HTML report, a markdown summary, CSV, PNGs, JSON.

The only module of the comparison that writes files. The HTML page reads top-down the way a person asks: the
verdict and what failed (with the steps that drive it), the curves (interactive plotly figures whose plotly.js
is inlined, so the file opens offline and can be attached to a ticket), then criteria, metrics, performance,
inputs with every fingerprint, the run's steps and both sides' host snapshots side by side. The markdown
summary is what a Prefect markdown artifact shows; the PNGs are for artifacts and papers; the CSV holds every
step of either log (aligned, with errors); `comparison.json` is the `alignflow compare --json` document. Each
file is written to a temporary name and renamed, so a reader never sees half a report.

One reference log can be compared with several test logs (`alignflow compare REF A B ...`): pass the
comparisons (same reference) and labels `(test_1, ..., test_n, reference)`; the figures draw one curve per log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from alignflow.compare import tables
from alignflow.compare.comparison import Comparison
from alignflow.compare.context import ReportContext
from alignflow.compare.names import png_name, thumbnail_name

log = logging.getLogger(__name__)

HTML_NAME, MARKDOWN_NAME, CSV_NAME, JSON_NAME = "report.html", "summary.md", "aligned.csv", "comparison.json"
META_NAME = "meta.json"  # what an index of reports lists: run, experiment, verdict, time (alignflow.reportserver)
MAX_SENTINEL_ROWS_HTML = 500
MAX_SENTINEL_ROWS_MD = 10
MAX_TOP_LINES = 6  # reasons shown above the curves; the rest are in the criteria table
# A word this long (a path, a host:path) widens its table past the page unless it may break: after its slashes.
LONG_TOKEN = re.compile(r"\S{40,}")
# A cell that is one number (with sign, exponent, %, unit-less step list) is right-aligned and never wrapped.
NUMERIC_CELL = re.compile(r"^[+-]?(\d[\d,]*(\.\d+)?|\.\d+)(e[+-]?\d+)?%?( ?(s|ms|min|h|B|KiB|MiB|GiB|TiB|x))?$"
                          r"|^n/a$|^(\d+ (h|min) )?\d+(\.\d+)? ?(s|min)$")


@dataclass(frozen=True, slots=True)
class ReportFiles:
    """Paths of the files `write_report` wrote."""

    html: Path
    markdown: Path
    csv: Path
    json: Path
    pngs: dict[str, Path] = field(default_factory=dict)
    thumbnails: dict[str, Path] = field(default_factory=dict)  # small loss / grad-norm PNGs (Prefect summary)
    meta: Path | None = None


def write_report(
    comparison: Comparison | Sequence[Comparison], out_dir: str | Path, *, title: str = "alignflow comparison",
    labels: Sequence[str] = ("test", "reference"), fingerprints: Mapping[str, Any] | None = None,
    plots: bool = True, context: ReportContext | None = None,
) -> ReportFiles:
    """Write the report files into `out_dir` (created if needed) and return their paths.

    `labels`: one name per test log, then the reference's. `context`: the run around the comparison (steps,
    fingerprints, host snapshots), when there is one. `plots=False` leaves out the PNGs and the curves.
    """
    comparisons = [comparison] if isinstance(comparison, Comparison) else list(comparison)
    names = tuple(labels)
    if not comparisons or len(names) != len(comparisons) + 1:
        raise ValueError(f"write_report: {len(comparisons)} comparison(s) need {len(comparisons) + 1} labels "
                         f"(tests, then the reference), got {len(names)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # one time for the page, the summary and the index's meta.json
    context = dataclasses.replace(context or ReportContext(),
                                  generated_at=(context.generated_at if context else None) or datetime.now(UTC))
    png_paths: dict[str, Path] = {}
    thumbs: dict[str, Path] = {}
    if plots and any(c.metrics for c in comparisons):
        from alignflow.compare.plots import metric_pngs, thumbnail_pngs

        for metric, data in metric_pngs(comparisons, labels=names).items():
            png_paths[metric] = _atomic_write(out / png_name(metric), data)
        for metric, data in thumbnail_pngs(comparisons[0], labels=(names[0], names[-1])).items():
            thumbs[metric] = _atomic_write(out / thumbnail_name(metric), data)
    csv_path = _atomic_write(out / CSV_NAME, aligned_csv(comparisons[0].aligned).encode())
    for n, c in enumerate(comparisons[1:], start=2):
        _atomic_write(out / f"aligned-{n}.csv", aligned_csv(c.aligned).encode())
    json_path = _atomic_write(out / JSON_NAME, json.dumps(report_json(comparisons, names, fingerprints, context),
                                                          indent=2, default=str).encode())
    md_path = _atomic_write(out / MARKDOWN_NAME, markdown_summary(
        comparisons, title=title, labels=names, fingerprints=fingerprints, context=context,
        png_names=[p.name for p in png_paths.values()]).encode())
    html_path = _atomic_write(out / HTML_NAME, html_report(
        comparisons, title=title, labels=names, fingerprints=fingerprints, context=context, plots=plots).encode())
    meta_path = _atomic_write(out / META_NAME, json.dumps(report_meta(comparisons, title, names, context),
                                                          indent=2).encode())
    log.info("report written to %s (verdict %s)", out, verdict_of(comparisons))
    return ReportFiles(html=html_path, markdown=md_path, csv=csv_path, json=json_path, pngs=png_paths,
                       thumbnails=thumbs, meta=meta_path)


def report_meta(comparisons: Sequence[Comparison], title: str, labels: Sequence[str],
                context: ReportContext) -> dict[str, Any]:
    """`meta.json`: the few facts an index of reports lists, so it never parses a whole comparison."""
    return {"title": title, "run_id": context.run_id, "experiment": context.experiment,
            "verdict": verdict_of(comparisons), "labels": list(labels),
            "generated_at": context.generated_at.isoformat() if context.generated_at else None,
            "steps_compared": [c.steps.compared for c in comparisons]}


def verdict_of(comparisons: Sequence[Comparison]) -> str:
    """pass only when every test log passes."""
    return "pass" if all(c.passed for c in comparisons) else "fail"


def report_json(comparisons: Sequence[Comparison], labels: Sequence[str],
                fingerprints: Mapping[str, Any] | None = None, context: ReportContext | None = None) -> dict[str, Any]:
    """`comparison.json`: one test log -> the `Comparison` document; several -> verdict + one document each.
    With the run's timing conditions (`context.timing`): how each side was timed and the speed sentences, ratio or
    refusal, as the report prints them (`timing`)."""
    if len(comparisons) == 1:
        doc = comparisons[0].to_json()
    else:
        doc = {"verdict": verdict_of(comparisons), "reference": labels[-1],
               "comparisons": [{"label": label, **c.to_json()} for label, c in zip(labels, comparisons, strict=False)]}
    if fingerprints:
        doc["fingerprints"] = dict(fingerprints)
    if context is not None and context.timing:
        doc["timing"] = {"sides": {label: cond.to_json() for label, cond in context.timing.items()},
                         "speed": tables.performance_table(comparisons, labels, context).notes}
    return doc


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


# ---- markdown ---------------------------------------------------------------------------------------------

def breakable(text: object) -> object:
    """A cell's text with a line-break opportunity (`<wbr>`) after each slash of its long words; others as is."""
    from markupsafe import Markup, escape

    plain = str(text)
    if not LONG_TOKEN.search(plain):
        return text
    return Markup(LONG_TOKEN.sub(lambda m: m.group().replace("/", "/<wbr>"), str(escape(plain))))


def numeric_columns(table: tables.Table) -> list[bool]:
    """Per column: every non-empty cell is a number (such columns are right-aligned)."""
    return [any(r[i] for r in table.rows) and all(NUMERIC_CELL.match(r[i]) or not r[i] for r in table.rows)
            for i in range(len(table.header))]


def md_table(table: tables.Table) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    numeric = numeric_columns(table)
    out = ["| " + " | ".join(cell(h) for h in table.header) + " |",
           "|" + "".join("---:|" if n else "---|" for n in numeric)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(out)


def markdown_summary(
    comparison: Comparison | Sequence[Comparison], *, title: str, labels: Sequence[str] = ("test", "reference"),
    fingerprints: Mapping[str, Any] | None = None, context: ReportContext | None = None,
    png_names: Sequence[str] = (),
) -> str:
    """The summary a Prefect markdown artifact shows: verdict and what failed first, then the tables."""
    cs = [comparison] if isinstance(comparison, Comparison) else list(comparison)
    verdict = verdict_of(cs)
    parts = [f"# {title}", "", f"**Verdict: {verdict.upper()}** — {' / '.join(labels[:-1])} vs {labels[-1]} "
             f"(error = test - reference)", ""]
    parts += [f"- {r}" for r in tables.failed_lines(cs, labels)]
    parts += [f"- {line}" for line in tables.divergence_lines(cs, labels)] + [""]
    parts += ["## Criteria", "", md_table(tables.criteria_table(cs, labels)), ""]
    if any(c.metrics for c in cs):
        metrics = tables.metrics_table(cs, labels)
        parts += ["## Metrics", "", md_table(metrics), ""] + [f"- {n}" for n in metrics.notes] + [""]
        ppl = tables.perplexity_table(cs, labels)
        if ppl.rows:
            parts += [md_table(ppl), ""]
    perf = tables.performance_table(cs, labels, context)
    parts += ["## Performance", "", md_table(perf), ""] + [f"- {n}" for n in perf.notes] + [""]
    memory = tables.memory_table(cs, labels)
    if memory.rows:
        parts += ["## Memory per rank", "", md_table(memory), ""] + [f"- {n}" for n in memory.notes] + [""]
    parts += ["## Steps compared", ""] + [f"- {line}" for line in tables.coverage_lines(cs, labels)] + [""]
    parts += ["## Sentinels", ""]
    for label, found in tables.sentinel_logs(cs, labels):
        parts.append(f"**{label}**: {len(found)} line(s), {sum(s.fatal for s in found)} fatal")
        if found:
            parts += ["", md_table(tables.sentinel_table(found, MAX_SENTINEL_ROWS_MD))]
        parts.append("")
    inputs = tables.inputs_table(cs, labels)
    parts += ["## Inputs", "", md_table(inputs), ""] + [f"- {n}" for n in inputs.notes] + [""]
    first = tables.first_interval_lines(cs, labels)
    if first:
        parts += ["Megatron first interval (megatron-core >= 0.16 averages each run's first printed iteration into "
                  "its next line):", ""] + [f"- {line}" for line in first] + [""]
    prints = tables.fingerprint_rows(fingerprints, context)
    if prints:
        parts += [md_table(tables.fingerprint_table(prints)), ""]
    if context is not None and context.steps:
        parts += ["## Run steps", "", md_table(tables.steps_table(context)), ""]
    if context is not None and len(context.snapshots) > 1:
        differ, _ = tables.environment_tables(context)
        parts += ["## Environment differences", ""]
        parts += [md_table(differ), ""] if differ.rows else ["none: both hosts' snapshots agree", ""]
    if png_names:
        parts += ["Plots: " + ", ".join(png_names), ""]
    return "\n".join(parts)


# ---- HTML -------------------------------------------------------------------------------------------------

def html_report(
    comparison: Comparison | Sequence[Comparison], *, title: str, labels: Sequence[str] = ("test", "reference"),
    fingerprints: Mapping[str, Any] | None = None, context: ReportContext | None = None, plots: bool = True,
) -> str:
    """One self-contained HTML page: style, plotly.js and the data inline, nothing fetched."""
    import jinja2
    from markupsafe import Markup

    cs = [comparison] if isinstance(comparison, Comparison) else list(comparison)
    figures: dict[str, str] = {}
    plotly_js = ""
    if plots and any(c.metrics for c in cs):
        from alignflow.compare import interactive

        figures = interactive.figure_divs(cs, labels)
        plotly_js = interactive.plotly_js()
    ctx = context or ReportContext()
    differ, same = tables.environment_tables(ctx) if len(ctx.snapshots) > 1 else (None, None)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["numeric"] = lambda text: bool(NUMERIC_CELL.match(str(text)))
    env.globals["numeric_columns"] = numeric_columns
    env.filters["long_token"] = lambda text: bool(LONG_TOKEN.search(str(text)))
    env.filters["breakable"] = breakable
    template = env.from_string(resources.files("alignflow.compare").joinpath("report.html").read_text("utf-8"))
    reasons = tables.failed_lines(cs, labels)
    return template.render(
        title=title, verdict=verdict_of(cs), labels=labels, context=ctx,
        generated=(ctx.generated_at or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M:%S %Z"),
        per_test=[(label, c.verdict, c.steps) for label, c in zip(labels, cs, strict=False)],
        reasons=reasons[:MAX_TOP_LINES], more_reasons=max(0, len(reasons) - MAX_TOP_LINES),
        divergence=tables.divergence_lines(cs, labels),
        figures=[(m, Markup(div)) for m, div in figures.items()],
        plotly_js=Markup(plotly_js.replace("</script", "<\\/script")),
        criteria=tables.criteria_table(cs, labels),
        metrics=tables.metrics_table(cs, labels) if any(c.metrics for c in cs) else None,
        perplexity=tables.perplexity_table(cs, labels),
        performance=tables.performance_table(cs, labels, ctx),
        memory=tables.memory_table(cs, labels),
        inputs=tables.inputs_table(cs, labels),
        first_interval=tables.first_interval_lines(cs, labels),
        fingerprints=tables.fingerprint_table(tables.fingerprint_rows(fingerprints, context)),
        steps=tables.steps_table(ctx) if ctx.steps else None, env_differ=differ, env_same=same,
        sentinels=[(label, found, tables.sentinel_table(found, MAX_SENTINEL_ROWS_HTML))
                   for label, found in tables.sentinel_logs(cs, labels)],
        coverage=tables.coverage_lines(cs, labels),
    )
