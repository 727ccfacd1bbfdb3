"""The alignment flow's tasks: each a thin adapter over one core function of `alignflow.runner`.

Tasks pass the core's own frozen records (`RunOptions`, `ArtifactRef`, `StepOutcome`, `Plan`): Prefect runs them
in this process, and they never reach Prefect's API as parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.states import Completed

from alignflow import pipeline
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.run import data_artifact, finish, preflight_run, start_run
from alignflow.runner.session import RunOptions, StepOutcome
from alignflow.runner.steps import run_step
from alignflow.runview import RunView
from alignflow.store.records import StepStatus
from tasks.context import open_store, run_context, runner_for, state_dir
from tasks.progress import TaskReporter

# Caching is alignflow's (the store decides by cache key and re-verified fingerprints), not Prefect's.
_COMMON: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}
CACHED = "Cached"  # the name Prefect's own cache gives a reused task result (its type stays COMPLETED)


def retry_on_transient(task: object, task_run: TaskRun, state: State[Any]) -> bool:
    """Retry only transport errors (connection, timeout); never a failed command, sentinel or comparison."""
    try:
        state.result()
    except Exception as exc:  # the state's exception is re-raised here
        return bool(getattr(exc, "retryable", False))
    return False


def step_state(outcome: StepOutcome) -> StepOutcome | State[Any]:
    """A reused step ends in Prefect's `Cached` state (Completed type) whose message names the run it was reused
    from, so the UI tells reused steps from executed ones; a step that ran returns its outcome (`Completed`)."""
    if outcome.status != StepStatus.CACHED:
        return outcome
    source = f"run {outcome.reused_from_run}" if outcome.reused_from_run else "the cache"
    detail = f" (step run {outcome.step_run_id})" if outcome.step_run_id else ""
    verdict = f"; verdict {outcome.verdict}" if outcome.verdict else ""
    return Completed(name=CACHED, message=f"reused from {source}{detail}{verdict}", data=outcome)


@task(name="start-run", task_run_name="start-run", **_COMMON)
def start_run_task(experiment: str, hosts: str, options: RunOptions) -> str:
    """Validate the experiment and inventory, record a new run; returns its id."""
    run_id = start_run(experiment, hosts, store=open_store(), state_dir=state_dir(), options=options)
    get_run_logger().info("run %s of %s started", run_id, experiment)
    return run_id


@task(name="preflight", task_run_name="preflight", **_COMMON)
def preflight_task(run_id: str) -> pipeline.Plan:
    """Compare both sides' alignment-critical settings before anything runs (a mismatch fails the task, with no
    retry); returns the plan the run executes."""
    ctx = run_context(run_id)
    preflight_run(ctx, state_dir=state_dir(), events=get_run_logger().info)
    return ctx.plan


@task(name="data", task_run_name="data", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_on_transient,
      **_COMMON)
def data_task(run_id: str) -> ArtifactRef:
    """Fingerprint (or generate) the data file both sides read."""
    ref = data_artifact(run_context(run_id), state_dir=state_dir())
    get_run_logger().info("data %s sha256 %s", ref.path, ref.sha256)
    return ref


@task(retries=3, retry_delay_seconds=[10, 60, 300], retry_jitter_factor=0.5, retry_condition_fn=retry_on_transient,
      **_COMMON)
def step_task(run_id: str, step: str, available: Mapping[str, ArtifactRef]) -> StepOutcome | State[Any]:
    """Run (or reuse) one pipeline step on its host; messages and progress go to the task log, a progress
    artifact and the process's observers (`tasks.progress`). A reused step ends in Prefect's `Cached` state
    naming the run it came from (`flows.states.step_state`); the task's result is the `StepOutcome` either way."""
    reporter = TaskReporter(get_run_logger(), step)
    try:
        with runner_for(run_id, events=reporter.message, progress=reporter.progress) as runner:
            outcome = run_step(runner, step, available)
    except BaseException as exc:
        reporter.failed(exc)
        raise
    reporter.ended(outcome)
    return step_state(outcome)


@task(name="finish-run", task_run_name="finish-run", **_COMMON)
def finish_task(run_id: str, outcomes: Mapping[str, StepOutcome], error: str | None = None,
                failures: tuple[BaseException, ...] = ()) -> RunView:
    """Close the run in the store (`failures`: the exceptions behind `error`, which tell a configuration or
    environment error from a failed step); returns what `alignflow show` shows of it."""
    return finish(open_store(), run_id, outcomes, error=error, failures=failures)
