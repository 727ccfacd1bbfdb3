"""The nightly's regression check as a Prefect task: one recorded run against its experiment's last passing run,
and each of its sides against its golden values when the experiment has some (`alignflow golden record`)."""

from __future__ import annotations

import dataclasses

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from alignflow.regression import DriftPolicy, RegressionCheck, check_against_last_pass
from alignflow.runner.goldens import check_run_goldens
from tasks.context import open_store, state_dir, transport_factory


@task(name="regression-check", task_run_name="regression-check", cache_policy=NO_CACHE, persist_result=False)
def regression_task(run_id: str, drift: DriftPolicy) -> RegressionCheck:
    """The run against its experiment's last passing run (the store), and its sides against their golden values
    where its experiments have some (the run's logs): what is out of margin joins the reasons."""
    store = open_store()
    check = check_against_last_pass(store, run_id, drift)
    golden = check_run_goldens(store, run_id, state_dir=state_dir(), transport_factory=transport_factory())
    if golden is not None and golden.verdict == "fail":
        check = dataclasses.replace(check, reasons=(*check.reasons, *(f"golden: {r}" for r in golden.reasons())))
    get_run_logger().info("%s run %s vs %s: %s", check.experiment, run_id, check.baseline_run_id or "no baseline",
                          "; ".join(check.reasons) or "no regression")
    return check
