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

from collections.abc import Sequence

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from alignflow.regression import RegressionCheck
from alignflow.reportserver import reports_url
from alignflow.runview import RunView
from flows.summaries import (
    artifact_key,
    metric_rows,
    metric_steps,
    nightly_markdown,
    nightly_message,
    nightly_rows,
    report_link,
    run_markdown,
    thumbnails,
)
from tasks.context import open_store, state_dir

__all__ = ["nightly_message", "publish_matrix_artifacts", "publish_nightly_artifacts", "publish_run_artifacts"]


@task(name="publish-artifacts", task_run_name="publish-artifacts", cache_policy=NO_CACHE,
      persist_result=False)
def publish_run_artifacts(view: RunView) -> None:
    """Summary, metric table and report link of one finished run (its comparison and data read from the store)."""
    store = open_store()
    comparison = store.comparison(view.run_id)
    data = next((ref for s in store.steps(view.run_id) if (ref := s.input_ref("data")) is not None), None)
    experiment, run_id = view.experiment, view.run_id
    url = report_link(view.report, reports_url=reports_url(state_dir())) if view.report else None
    create_markdown_artifact(run_markdown(view, comparison, data=data, report_url=url, plots=thumbnails(view.report)),
                             key=artifact_key(experiment, "summary"),
                             description=f"alignflow run {run_id}: verdict {view.verdict}")
    rows = metric_rows(comparison) if comparison is not None else []
    if rows:
        steps = metric_steps(comparison) if comparison is not None else None
        over = f" over {steps} steps" if steps is not None else ""
        create_table_artifact(rows, key=artifact_key(experiment, "metrics"),
                              description=f"error statistics of run {run_id}{over} (report notation)")
    if url:
        source = view.report_run or run_id
        text = f"{experiment} report (run {source})" + (f", reused by run {run_id}" if source != run_id else "")
        create_link_artifact(url, link_text=text, key=artifact_key(experiment, "report"),
                             description=f"HTML report of run {source}"
                                         + (f" (compare reused from it by run {run_id})" if source != run_id else ""))


@task(name="publish-matrix", task_run_name="publish-matrix", cache_policy=NO_CACHE, persist_result=False)
def publish_matrix_artifacts(run_id: str) -> None:
    """The switch matrix of a run as one table artifact (`<experiment>-matrix`) and a link to its report."""
    from alignflow.matrix.report import artifact_rows

    store = open_store()
    record = store.matrix(run_id)
    if record is None:
        return
    experiment = store.get_run(run_id).experiment
    create_table_artifact(artifact_rows(record.summary), key=artifact_key(experiment, "matrix"),
                          description=f"switch matrix of run {run_id}: verdict {record.verdict} (OFF -> ON per "
                                      "variant and side, as seed 004's tables)")
    if record.report:
        url = report_link(record.report, reports_url=reports_url(state_dir()))
        create_link_artifact(url, link_text=f"{experiment} matrix report (run {run_id})",
                             key=artifact_key(experiment, "matrix-report"),
                             description=f"matrix report of run {run_id}")


def publish_nightly_artifacts(checks: Sequence[RegressionCheck]) -> None:
    create_markdown_artifact(nightly_markdown(checks), key="nightly-regressions",
                             description=nightly_message(checks))
    create_table_artifact(nightly_rows(checks), key="nightly-criteria",
                          description="every criterion of every nightly experiment against its last passing run")
