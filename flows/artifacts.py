"""Publish alignflow runs and nightly checks as Prefect artifacts (the store stays the system of record).

Per alignment run (keys per experiment, so the Artifacts page shows each experiment's history as versions):

- `<experiment>-summary` (markdown): verdict, the loss and grad-norm curves (small PNGs embedded as data URIs,
  so the UI shows them without a click and without reaching any other server), criteria table, which steps ran
  and which came from the cache (and from which run), the fingerprints of the data and of every checkpoint, a
  link to the HTML report;
- `<experiment>-metrics` (table): the error statistics of the comparison, one row per statistic and a column per
  metric, every cell in the report's notation (`alignflow.compare.tables.metric_cells`);
- `<experiment>-report` (link): the HTML report over http. `alignflow serve` serves the state dir's `reports/`
  read-only and publishes the address (`alignflow.reportserver`); `ALIGNFLOW_REPORTS_URL` names another server
  (the nginx of docker/compose.yaml). Only without either is the link a `file://` URI (opens on the controller
  alone). A run whose `compare` step was reused links the report of the run it was reused from, and says so.

Per nightly run: `nightly-regressions` (markdown) and `nightly-criteria` (table).
The renderers are pure functions of the records (`flows.summaries`), tested without Prefect.
"""

from typing import Any

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from alignflow.reportserver import reports_url
from flows.summaries import (
    artifact_key,
    metric_rows,
    metric_steps,
    nightly_markdown,
    nightly_message,
    nightly_rows,
    report_link,
    report_run,
    run_markdown,
    thumbnails,
)
from tasks.context import open_store, state_dir

__all__ = ["nightly_message", "publish_nightly_artifacts", "publish_run_artifacts"]


@task(name="publish-artifacts", task_run_name="publish-artifacts", cache_policy=NO_CACHE,
      persist_result=False)
def publish_run_artifacts(record: dict[str, Any]) -> None:
    """Summary, metric table and report link of one finished run, read back from the store."""
    store = open_store()
    comp = store.comparison(record["run_id"])
    comparison = None if comp is None else {"criteria": comp.criteria, "verdict": comp.verdict,
                                            "summary": comp.summary}
    trigger = store.get_run(record["run_id"]).trigger
    data = next((s.inputs["data"] for s in store.steps(record["run_id"]) if "data" in (s.inputs or {})), None)
    experiment, run_id = record["experiment"], record["run_id"]
    url = report_link(record["report"], reports_url=reports_url(state_dir())) if record.get("report") else None
    create_markdown_artifact(run_markdown(record, comparison, data=data, trigger=trigger, report_url=url,
                                          plots=thumbnails(record.get("report"))),
                             key=artifact_key(experiment, "summary"),
                             description=f"alignflow run {run_id}: verdict {record.get('verdict')}")
    rows = metric_rows(comparison) if comparison is not None else []
    if rows:
        steps = metric_steps(comparison) if comparison is not None else None
        over = f" over {steps} steps" if steps is not None else ""
        create_table_artifact(rows, key=artifact_key(experiment, "metrics"),
                              description=f"error statistics of run {run_id}{over} (report notation)")
    if url:
        source = report_run(record)
        text = f"{experiment} report (run {source})" + (f", reused by run {run_id}" if source != run_id else "")
        create_link_artifact(url, link_text=text, key=artifact_key(experiment, "report"),
                             description=f"HTML report of run {source}"
                                         + (f" (compare reused from it by run {run_id})" if source != run_id else ""))


def publish_nightly_artifacts(checks: list[dict[str, Any]]) -> None:
    create_markdown_artifact(nightly_markdown(checks), key="nightly-regressions",
                             description=nightly_message(checks))
    create_table_artifact(nightly_rows(checks), key="nightly-criteria",
                          description="every criterion of every nightly experiment against its last passing run")
