"""Publish alignflow runs and nightly checks as Prefect artifacts (the store stays the system of record).

Per alignment run (keys per experiment, so the Artifacts page shows each experiment's history as versions):

- `<experiment>-summary` (markdown): verdict, criteria table, which steps ran and which came from the cache,
  the fingerprints of the data and of every checkpoint, a link to the HTML report;
- `<experiment>-metrics` (table): per-metric error statistics of the comparison;
- `<experiment>-report` (link): the HTML report. Set `ALIGNFLOW_REPORTS_URL` to the address under which the
  state dir's `reports/` is served (docker/compose.yaml serves it); without it the link is a `file://` URI,
  which opens only on the controller.

Per nightly run: `nightly-regressions` (markdown) and `nightly-criteria` (table).
The renderers are pure functions of the records, so they are tested without a Prefect server.
"""

import os
from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

WEIGHTS = (("base_ckpt", "NPU base checkpoint"), ("bf16_ckpt", "bf16 checkpoint"),
           ("megatron_ckpt", "Megatron checkpoint"))
METRIC_COLUMNS = ("n", "me", "mean_abs", "max_abs", "max_abs_step", "mean_rel", "max_rel", "max_rel_step",
                  "not_compared", "resolution_text")


def artifact_key(experiment: str, suffix: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only (orchestration reference §1.8)."""
    clean = "-".join(filter(None, "".join(c if c.isalnum() else " " for c in experiment.lower()).split()))
    return f"{clean or 'experiment'}-{suffix}"[:100]


def report_link(report: str, *, reports_url: str | None = None) -> str:
    """Where a person opens the HTML report: under `reports_url` when the reports dir is served, else file://."""
    path = Path(report)
    if reports_url and path.parent.parent.name == "reports":
        return f"{reports_url.rstrip('/')}/{path.parent.name}/{path.name}"
    return path.resolve().as_uri()


def _num(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _cell(text: Any) -> str:
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


def _seconds(step: dict[str, Any]) -> str:
    from datetime import datetime

    if not step.get("started") or not step.get("finished"):
        return "—"
    delta = datetime.fromisoformat(step["finished"]) - datetime.fromisoformat(step["started"])
    return f"{delta.total_seconds():.1f} s"


def fingerprints(record: dict[str, Any], data: dict[str, Any] | None) -> list[tuple[str, str, str, int | None]]:
    """(what, path, sha256, size) of the data file and of each checkpoint the run produced or reused."""
    rows: list[tuple[str, str, str, int | None]] = []
    if data:
        rows.append(("data", str(data.get("path", "")), str(data.get("sha256", "")), data.get("size")))
    outputs = {a["name"]: a for s in record["steps"] for a in s["artifacts"]}
    for name, what in WEIGHTS:
        if name in outputs:
            a = outputs[name]
            rows.append((what, f"{a['host']}:{a['path']}", a["sha256"], a.get("size")))
    return rows


def run_markdown(record: dict[str, Any], comparison: dict[str, Any] | None, *, data: dict[str, Any] | None = None,
                 trigger: str | None = None, report_url: str | None = None) -> str:
    """The summary of one run: verdict, criteria, steps (ran / cached), fingerprints, report link."""
    verdict = (record.get("verdict") or "none").upper()
    head = [f"**Verdict: {verdict}**", f"status {record['status']}"]
    if trigger:
        head.append(f"trigger {trigger}")
    if record.get("parent"):
        head.append(f"parent `{record['parent']}`")
    lines = [f"# {record['experiment']} — run `{record['run_id']}`", "", " · ".join(head), ""]
    if record.get("error"):
        lines += ["> " + str(record["error"]).replace("\n", "\n> "), ""]
    if comparison:
        lines += ["## Criteria", "", "| criterion | value | threshold | result |", "|---|---|---|---|"]
        for c in comparison.get("criteria", []):
            label = _cell(c.get("label") or f"{c.get('statistic')}({c.get('metric')})")
            lines.append(f"| {label} | {_num(c.get('value'))} | {c.get('threshold'):g} | "
                         f"{'pass' if c.get('passed') else '**FAIL**'} |")
        lines.append("")
    counts: dict[str, int] = {}
    for s in record["steps"]:
        counts[s["status"]] = counts.get(s["status"], 0) + 1
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lines += [f"## Steps ({tally})", "", "| step | host | status | time | outputs (sha256) |", "|---|---|---|---|---|"]
    for s in record["steps"]:
        outs = ", ".join(f"{a['name']} `{a['sha256'][:12]}`" for a in s["artifacts"]) or "—"
        lines.append(f"| {s['step']} | {s['host'] or '—'} | {s['status']} | {_seconds(s)} | {outs} |")
    prints = fingerprints(record, data)
    if prints:
        lines += ["", "## Fingerprints", "", "| what | sha256 | size | where |", "|---|---|---|---|"]
        lines += [f"| {what} | `{sha}` | {_size(size)} | `{where}` |" for what, where, sha, size in prints]
    if report_url:
        lines += ["", f"Report: [{Path(str(record['report'])).name}]({report_url})"]
    return "\n".join(lines)


def metric_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per compared metric: its error statistics (dict-valued ones such as step_rel left out)."""
    metrics = (comparison.get("summary") or {}).get("metrics") or {}
    return [{"metric": m, **{k: stats.get(k) for k in METRIC_COLUMNS if k in stats}} for m, stats in metrics.items()]


def publish_run_artifacts(record: dict[str, Any]) -> None:
    """Summary, metric table and report link of one finished run, read back from the store."""
    from tasks.context import open_store

    store = open_store()
    try:
        comp = store.comparison(record["run_id"])
        comparison = None if comp is None else {"criteria": comp.criteria, "verdict": comp.verdict,
                                                "summary": comp.summary}
        trigger = store.get_run(record["run_id"]).trigger
        data = next((s.inputs["data"] for s in store.steps(record["run_id"]) if "data" in (s.inputs or {})), None)
    finally:
        store.close()
    experiment, run_id = record["experiment"], record["run_id"]
    url = report_link(record["report"], reports_url=os.environ.get("ALIGNFLOW_REPORTS_URL")) if record.get(
        "report") else None
    create_markdown_artifact(run_markdown(record, comparison, data=data, trigger=trigger, report_url=url),
                             key=artifact_key(experiment, "summary"),
                             description=f"alignflow run {run_id}: verdict {record.get('verdict')}")
    rows = metric_rows(comparison) if comparison is not None else []
    if rows:
        create_table_artifact(rows, key=artifact_key(experiment, "metrics"),
                              description=f"per-metric error statistics of run {run_id}")
    if url:
        create_link_artifact(url, link_text=f"{experiment} report (run {run_id})",
                             key=artifact_key(experiment, "report"), description=f"HTML report of run {run_id}")


def nightly_message(checks: list[dict[str, Any]]) -> str:
    """One line for the flow run's state: which experiments regressed and why (what automations show)."""
    bad = [c for c in checks if c["regressed"]]
    if not bad:
        return f"nightly: no regression in {len(checks)} experiment(s)"
    parts = [f"{c['experiment']} ({'; '.join(c['reasons'])})" for c in bad]
    return f"nightly: {len(bad)} of {len(checks)} experiment(s) regressed: " + "; ".join(parts)


def nightly_markdown(checks: list[dict[str, Any]]) -> str:
    bad = [c for c in checks if c["regressed"]]
    title = f"{len(bad)} of {len(checks)} experiment(s) regressed" if bad else "no regression"
    lines = [f"# Nightly regression check — {title}", "",
             "| experiment | run | verdict | last passing run | result |", "|---|---|---|---|---|"]
    for c in checks:
        run = f"`{c['run_id']}`" if c.get("run_id") else "—"
        base = f"`{c['baseline_run_id']}`" if c.get("baseline_run_id") else "none"
        result = "**REGRESSED**: " + "; ".join(c["reasons"]) if c["regressed"] else "ok"
        if c.get("config_changed"):
            result += " (experiment changed since the baseline)"
        lines.append(f"| {c['experiment']} | {run} | {c.get('verdict') or c['status']} | {base} | {_cell(result)} |")
    for c in bad:
        moved = [ch for ch in c.get("changes", []) if ch.get("baseline") is not None]
        if not moved:
            continue
        lines += ["", f"## {c['experiment']}", "", "| criterion | last pass | now | change | allowed | regression |",
                  "|---|---|---|---|---|---|"]
        for ch in moved:
            lines.append(f"| {_cell(ch['label'])} | {_num(ch['baseline'])} | {_num(ch['value'])} | "
                         f"{_num(ch['change'])} | {_num(ch['allowed'])} | {ch['regression'] or '—'} |")
    return "\n".join(lines)


def nightly_rows(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per experiment and criterion (one per experiment that has no criteria to show)."""
    rows = []
    for c in checks:
        base = {"experiment": c["experiment"], "run": c.get("run_id"), "baseline_run": c.get("baseline_run_id"),
                "verdict": c.get("verdict"), "regressed": c["regressed"]}
        if not c.get("changes"):
            rows.append({**base, "criterion": None, "regression": "; ".join(c["reasons"]) or None})
        for ch in c.get("changes", []):
            rows.append({**base, "criterion": ch["label"], "last_pass": ch["baseline"], "now": ch["value"],
                         "change": ch["change"], "allowed": ch["allowed"], "regression": ch["regression"]})
    return rows


def publish_nightly_artifacts(checks: list[dict[str, Any]]) -> None:
    create_markdown_artifact(nightly_markdown(checks), key="nightly-regressions",
                             description=nightly_message(checks))
    create_table_artifact(nightly_rows(checks), key="nightly-criteria",
                          description="every criterion of every nightly experiment against its last passing run")
