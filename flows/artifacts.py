"""Publish an alignflow run as Prefect artifacts: markdown summary, criteria table, link to the HTML report.

The store is the system of record; these are a view for the Prefect UI (ARCHITECTURE §6).
"""

from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact


def _key(experiment: str, suffix: str) -> str:
    # Artifact keys: lowercase letters, digits and dashes only (orchestration reference §1.8).
    clean = "".join(c if c.isalnum() else "-" for c in experiment.lower()).strip("-")
    return f"{clean}-{suffix}"[:100]


def run_markdown(record: dict[str, Any], comparison: dict[str, Any] | None) -> str:
    verdict = (record.get("verdict") or "none").upper()
    lines = [f"# {record['experiment']} — run `{record['run_id']}`", "",
             f"**Verdict: {verdict}** · status {record['status']}"
             + (f" · parent `{record['parent']}`" if record.get("parent") else ""), ""]
    if record.get("error"):
        lines += [f"> {record['error']}", ""]
    if comparison:
        lines += ["| criterion | value | threshold | result |", "|---|---|---|---|"]
        for c in comparison.get("criteria", []):
            value = c.get("value")
            shown = "n/a" if value is None else f"{value:.6g}"
            lines.append(f"| {c.get('statistic')}({c.get('metric')}) | {shown} | {c.get('threshold'):g} | "
                         f"{'pass' if c.get('passed') else 'FAIL'} |")
        lines.append("")
    lines += ["| step | host | status | outputs (sha256) |", "|---|---|---|---|"]
    for s in record["steps"]:
        outs = ", ".join(f"{a['name']} `{a['sha256'][:12]}`" for a in s["artifacts"]) or "—"
        lines.append(f"| {s['step']} | {s['host'] or '—'} | {s['status']} | {outs} |")
    if record.get("report"):
        lines += ["", f"Report: `{record['report']}`"]
    return "\n".join(lines)


def publish_run_artifacts(record: dict[str, Any]) -> None:
    from tasks.context import open_store

    store = open_store()
    try:
        comp = store.comparison(record["run_id"])
        comparison = None if comp is None else {"criteria": comp.criteria, "verdict": comp.verdict,
                                                "summary": comp.summary}
    finally:
        store.close()
    create_markdown_artifact(run_markdown(record, comparison), key=_key(record["experiment"], "summary"),
                             description=f"alignflow run {record['run_id']}: verdict {record.get('verdict')}")
    if comparison is not None:
        rows = [{"metric": m, **{k: v for k, v in stats.items() if not isinstance(v, dict)}}
                for m, stats in (comparison["summary"].get("metrics") or {}).items()]
        if rows:
            create_table_artifact(rows, key=_key(record["experiment"], "metrics"),
                                  description=f"per-metric error statistics of run {record['run_id']}")
    if record.get("report"):
        create_link_artifact(f"file://{record['report']}", link_text="HTML report",
                             key=_key(record["experiment"], "report"),
                             description=f"comparison report of run {record['run_id']}")
