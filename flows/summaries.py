"""What alignflow shows in the Prefect UI, as text: the run summary (markdown with the curves embedded), the
metric table, the report link and the nightly check — pure functions of the records (`RunView`, the store's
`ComparisonRecord`, `RegressionCheck`), free of Prefect, so they are tested (and imported) without it.
`flows.artifacts` publishes them as Prefect artifacts."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path

from alignflow.compare.formatting import fmt_percent_of, fmt_value
from alignflow.compare.names import THUMBNAIL_METRICS, thumbnail_name
from alignflow.compare.tables import metric_cells, metric_header
from alignflow.config.statistics import is_averaged, is_relative
from alignflow.pipeline import ARTIFACTS
from alignflow.regression import RegressionCheck
from alignflow.runview import RunView, StepView
from alignflow.store.records import ArtifactRef, ComparisonRecord

WEIGHTS = tuple((a.name, a.label) for a in ARTIFACTS.values() if a.kind == "checkpoint")


def artifact_key(experiment: str, suffix: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only (docs/orchestration.md#artifacts)."""
    clean = "-".join(filter(None, "".join(c if c.isalnum() else " " for c in experiment.lower()).split()))
    return f"{clean or 'experiment'}-{suffix}"[:100]


def report_link(report: str, *, reports_url: str | None = None) -> str:
    """Where a person opens the HTML report: under `reports_url` when the reports dir is served, else file://."""
    path = Path(report)
    if reports_url and path.parent.parent.name == "reports":
        return f"{reports_url.rstrip('/')}/{path.parent.name}/{path.name}"
    return path.resolve().as_uri()


def thumbnails(report: str | None) -> dict[str, str]:
    """The report's loss / grad-norm thumbnails as `data:` URIs (metric -> URI), those that exist."""
    if not report:
        return {}
    out = {}
    for metric in THUMBNAIL_METRICS:
        png = Path(report).parent / thumbnail_name(metric)
        if png.is_file():
            out[metric] = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
    return out


def _statistic(key: str) -> str:
    """`me(lm_loss)@steps=1` -> `me`: the statistic of a criterion key (alignflow.regression.criterion_key)."""
    return key.split("(", 1)[0]


def stat_text(value: float | None, key: str, *, signed: bool = False) -> str:
    """A criterion's quantity (or a change of it) in the report's notation: percent for relative statistics, the
    averages' extra digit (`alignflow.compare.formatting`); a sign only on changes."""
    if value is None:
        return "n/a"
    statistic = _statistic(key)
    if is_relative(statistic):
        text = fmt_percent_of(float(value), extra=1 if is_averaged(statistic) else 0)
        return ("+" if value >= 0 else "-") + text if signed and text != "0%" else text
    return fmt_value(float(value), extra=1 if is_averaged(statistic) else 0, signed=signed)


def _cell(text: object) -> str:
    """A markdown table cell: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _size(n: int | None) -> str:
    if n is None:
        return "—"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def _seconds(step: StepView) -> str:
    if step.started is None or step.finished is None:
        return "—"
    return f"{(step.finished - step.started).total_seconds():.1f} s"


def fingerprints(view: RunView, data: ArtifactRef | None) -> list[tuple[str, str, str, int | None]]:
    """(what, path, sha256, size) of the data file and of each checkpoint the run produced or reused."""
    rows: list[tuple[str, str, str, int | None]] = []
    if data:
        rows.append(("data", data.path, data.sha256, data.size))
    outputs = {a.name: a for s in view.steps for a in s.artifacts}
    for name, what in WEIGHTS:
        if name in outputs:
            a = outputs[name]
            rows.append((what, f"{a.host}:{a.path}", a.sha256, a.size_bytes))
    return rows


def run_markdown(view: RunView, comparison: ComparisonRecord | None, *, data: ArtifactRef | None = None,
                 report_url: str | None = None, plots: Mapping[str, str] | None = None) -> str:
    """The summary of one run: verdict, curves, criteria, steps (ran / cached, from which run), fingerprints and
    the report link (which names the run that wrote the report when `compare` was reused)."""
    head = [f"**Verdict: {(view.verdict or 'none').upper()}**", f"status {view.status}", f"trigger {view.trigger}"]
    if view.parent_id:
        head.append(f"parent `{view.parent_id}`")
    lines = [f"# {view.experiment} — run `{view.run_id}`", "", " · ".join(head), ""]
    if view.error:
        lines += ["> " + view.error.replace("\n", "\n> "), ""]
    elif view.verdict == "fail" and view.reasons:
        lines += ["Not aligned:", "", *[f"- {_cell(r)}" for r in view.reasons], ""]
    if plots:
        lines += [" ".join(f"![{metric}]({uri})" for metric, uri in plots.items()), ""]
    if comparison:
        lines += _criteria_lines(comparison)
    lines += _steps_lines(view)
    prints = fingerprints(view, data)
    if prints:
        lines += ["", "## Fingerprints", "", "| what | sha256 | size | where |", "|---|---|---|---|"]
        lines += [f"| {what} | `{sha}` | {_size(size)} | `{where}` |" for what, where, sha, size in prints]
    if report_url and view.report:
        source = view.report_run
        reused = f" — reused from run `{source}` (its comparison is this run's)" if source != view.run_id else ""
        lines += ["", f"Report: [{Path(view.report).name}]({report_url}){reused}"]
    return "\n".join(lines)


def _criteria_lines(comparison: ComparisonRecord) -> list[str]:
    """The criteria table, in the report's notation (alignflow.compare.formatting): the same value and unit as the
    HTML and the CLI."""
    from alignflow.runview import criterion_view

    lines = ["## Criteria", "", "| criterion | value | threshold | result | diverges at | driving steps |",
             "|---|---:|---:|---|---:|---|"]
    for doc in comparison.criteria:
        c = criterion_view(doc)
        lines.append(f"| {_cell(c.label)} | {c.value_text} | {c.threshold_text} | "
                     f"{'pass' if c.passed else '**FAIL**'} | {c.first_outside or ''} | "
                     f"{', '.join(map(str, c.driving_steps))} |")
    return [*lines, ""]


def _steps_lines(view: RunView) -> list[str]:
    """The steps table: status (and the run a cached step came from), time, outputs with their sha256."""
    counts: dict[str, int] = {}
    for s in view.steps:
        counts[s.status] = counts.get(s.status, 0) + 1
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lines = [f"## Steps ({tally})", "", "| step | host | status | time | outputs (sha256) |", "|---|---|---|---|---|"]
    for s in view.steps:
        outs = ", ".join(f"{a.name} `{a.sha256[:12]}`" for a in s.artifacts) or "—"
        status = s.status + (f" (run `{s.reused_from_run}`)" if s.reused_from_run else "")
        lines.append(f"| {s.step} | {s.host or '—'} | {status} | {_seconds(s)} | {outs} |")
    return lines


# the rows whose cells carry the step of their maximum, `2e-06 (2)`
AT_STEP = {"max |e|": "max |e| (step)", "max rel": "max rel (step)"}


def metric_rows(comparison: ComparisonRecord) -> list[dict[str, str]]:
    """The metrics table of the report, transposed for the UI's table (it scrolls sideways past ~6 columns in its
    box and shows 10 rows a page): one row per statistic, a column per metric, every cell the report's text (the
    step of a maximum beside it, in the rows `max |e| (step)` and `max rel (step)`: `2e-06 (2)`), so the ten rows
    and every column show at once. The step goes in brackets without the word: with `(step 2)` in every cell, five
    metric columns filled the box to the pixel, and a wider digit made it scroll. A column is
    named by its metric alone when every metric was compared over the same steps (`metric_steps` says how many),
    else `lm_loss (n=30)`."""
    metrics = (comparison.summary or {}).get("metrics") or {}
    if not metrics:
        return []
    counts = {m: dict(zip(metric_header(), metric_cells(m, stats), strict=True))["n"] for m, stats in metrics.items()}
    uniform = len(set(counts.values())) == 1
    rows: dict[str, dict[str, str]] = {}
    for m, stats in metrics.items():
        cells = dict(zip(metric_header(), metric_cells(m, stats), strict=True))  # "at step" twice: replaced below
        cells["max |e|"] += _at(stats.get("max_abs_step"))
        cells["max rel"] += _at(stats.get("max_rel_step"))
        column = m if uniform else f"{m} (n={cells['n']})"
        for name, text in cells.items():
            if name not in ("metric", "n", "at step"):
                label = AT_STEP.get(name, name)
                rows.setdefault(label, {"statistic": label})[column] = text
    return list(rows.values())


def metric_steps(comparison: ComparisonRecord) -> str | None:
    """How many steps every metric was compared over (`8`), or None when they differ or there are none."""
    metrics = (comparison.summary or {}).get("metrics") or {}
    counts = {dict(zip(metric_header(), metric_cells(m, stats), strict=True))["n"] for m, stats in metrics.items()}
    return next(iter(counts)) if len(counts) == 1 else None


def _at(step: object) -> str:
    return "" if step is None else f" ({step})"


def nightly_message(checks: Sequence[RegressionCheck]) -> str:
    """One line for the flow run's state: which experiments regressed and why (what automations show)."""
    bad = [c for c in checks if c.regressed]
    notes = "".join(f"\nnote: {c.experiment}: {n}" for c in checks for n in c.notes)
    if not bad:
        return f"nightly: no regression in {len(checks)} experiment(s){notes}"
    parts = [f"{c.experiment} ({'; '.join(c.reasons)})" for c in bad]
    return f"nightly: {len(bad)} of {len(checks)} experiment(s) regressed: " + "; ".join(parts) + notes


def nightly_markdown(checks: Sequence[RegressionCheck]) -> str:
    bad = [c for c in checks if c.regressed]
    title = f"{len(bad)} of {len(checks)} experiment(s) regressed" if bad else "no regression"
    lines = [f"# Nightly regression check — {title}", "",
             "| experiment | run | verdict | last passing run | result |", "|---|---|---|---|---|"]
    for c in checks:
        run = f"`{c.run_id}`" if c.run_id else "—"
        base = f"`{c.baseline_run_id}`" if c.baseline_run_id else "none"
        result = "**REGRESSED**: " + "; ".join(c.reasons) if c.regressed else "ok"
        if c.config_changed:
            result += " (" + ("; ".join(c.notes) or "experiment changed since the baseline") + ")"
        lines.append(f"| {c.experiment} | {run} | {c.verdict or c.status} | {base} | {_cell(result)} |")
    for c in bad:
        moved = [ch for ch in c.changes if ch.baseline is not None]
        if not moved:
            continue
        lines += ["", f"## {c.experiment}", "", "| criterion | last pass | now | change | allowed | regression |",
                  "|---|---|---|---|---|---|"]
        for ch in moved:
            lines.append(f"| {_cell(ch.label)} | {stat_text(ch.baseline, ch.key)} | {stat_text(ch.value, ch.key)} | "
                         f"{stat_text(ch.change, ch.key, signed=True)} | {stat_text(ch.allowed, ch.key)} | "
                         f"{_cell(ch.regression or '—')} |")
    return "\n".join(lines)


NIGHTLY_COLUMNS = ("experiment", "run", "baseline_run", "verdict", "regressed", "criterion", "last_pass", "now",
                   "change", "allowed", "regression")


def nightly_rows(checks: Sequence[RegressionCheck]) -> list[dict[str, str]]:
    """One row per experiment and criterion (one per experiment that has no criteria to show), every column in
    every row, values in the report's notation."""
    rows = []
    for c in checks:
        base = {"experiment": c.experiment, "run": c.run_id or "", "baseline_run": c.baseline_run_id or "",
                "verdict": c.verdict or c.status or "", "regressed": "yes" if c.regressed else "no"}
        if not c.changes:
            rows.append({**base, "criterion": "", "last_pass": "", "now": "", "change": "", "allowed": "",
                         "regression": "; ".join(c.reasons)})
        for ch in c.changes:
            rows.append({**base, "criterion": ch.label, "last_pass": stat_text(ch.baseline, ch.key),
                         "now": stat_text(ch.value, ch.key), "change": stat_text(ch.change, ch.key, signed=True),
                         "allowed": stat_text(ch.allowed, ch.key), "regression": ch.regression or ""})
    return [{k: row[k] for k in NIGHTLY_COLUMNS} for row in rows]
