"""The nightly's regression check as a Prefect task: one recorded run against its experiment's last passing run."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from alignflow.regression import DriftPolicy, RegressionCheck, check_against_last_pass
from tasks.context import open_store


@task(name="regression-check", task_run_name="regression-check", cache_policy=NO_CACHE, persist_result=False)
def regression_task(run_id: str, drift: DriftPolicy) -> RegressionCheck:
    """The run against its experiment's last passing run (reads the store only)."""
    check = check_against_last_pass(open_store(), run_id, drift)
    get_run_logger().info("%s run %s vs %s: %s", check.experiment, run_id, check.baseline_run_id or "no baseline",
                          "; ".join(check.reasons) or "no regression")
    return check
