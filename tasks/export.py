"""The nightly's export of one run (TensorBoard and/or MLflow) as a Prefect task."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from alignflow.export import export_run
from tasks.context import open_store


@task(name="export", task_run_name="export-{run_id}", cache_policy=NO_CACHE, persist_result=False)
def export_task(run_id: str, tensorboard: str | None, mlflow: str | None) -> list[str]:
    """`alignflow export RUN` with the nightly's targets; the lines saying where the run went."""
    done = export_run(open_store(), run_id, tensorboard=tensorboard, mlflow=mlflow)
    for line in done:
        get_run_logger().info("run %s: %s", run_id, line)
    return done
