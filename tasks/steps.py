"""One Prefect task per pipeline step — each a thin adapter over `alignflow.runner.run.run_step`."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.run import data_artifact, finish, preflight_run, run_step, start_run
from alignflow.runner.session import RunOptions, StepOutcome
from tasks.context import open_store, retry_on_transient, runner_for, state_dir

# Caching is alignflow's (the store decides by cache key and re-verified fingerprints), not Prefect's.
_COMMON: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


@task(name="start-run", **_COMMON)
def start_run_task(experiment: str, hosts: str, options: dict[str, Any]) -> str:
    """Validate the experiment and inventory, record a new run; returns its id."""
    store = open_store()
    try:
        run_id = start_run(experiment, hosts, store=store, state_dir=state_dir(), options=RunOptions(**options))
    finally:
        store.close()
    get_run_logger().info("run %s of %s started", run_id, experiment)
    return run_id


@task(name="preflight", **_COMMON)
def preflight_task(run_id: str) -> dict[str, Any]:
    """Compare both sides' alignment-critical settings before anything runs; a mismatch fails the task (no retry)."""
    logger = get_run_logger()
    store = open_store()
    try:
        report = preflight_run(run_id, store=store, state_dir=state_dir(), events=logger.info)
    finally:
        store.close()
    if report is None:  # turned off by the experiment (`preflight: false`); said in the log
        return {"checked": False}
    result: dict[str, Any] = report.to_dict()
    return result


@task(name="data", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_on_transient, **_COMMON)
def data_task(run_id: str) -> dict[str, Any]:
    """Fingerprint (or generate) the data file both sides read."""
    with runner_for(run_id, events=get_run_logger().info) as runner:
        ref = data_artifact(runner)
    get_run_logger().info("data %s sha256 %s", ref.path, ref.sha256)
    return ref.to_dict()


@task(retries=3, retry_delay_seconds=[10, 60, 300], retry_jitter_factor=0.5, retry_condition_fn=retry_on_transient,
      **_COMMON)
def step_task(run_id: str, step: str, available: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Run (or reuse) one pipeline step on its host; progress goes to the task log."""
    logger = get_run_logger()
    with runner_for(run_id, events=logger.info) as runner:
        outcome = run_step(runner, step, {k: ArtifactRef.from_dict(v) for k, v in available.items()})
    logger.info("%s: %s", step, outcome.status)
    return outcome.to_dict()


@task(name="finish-run", **_COMMON)
def finish_task(run_id: str, outcomes: dict[str, dict[str, Any]], error: str | None = None,
                cancelled: bool = False) -> dict[str, Any]:
    """Close the run in the store; returns the `alignflow show` object."""
    store = open_store()
    try:
        return finish(store, run_id, {k: StepOutcome.from_dict(v) for k, v in outcomes.items()}, error=error,
                      cancelled=cancelled)
    finally:
        store.close()
