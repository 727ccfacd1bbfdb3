"""The alignment flow's tasks: each a thin adapter over one core function of `alignflow.runner`.

Tasks pass the core's own frozen records (`RunOptions`, `ArtifactRef`, `StepOutcome`, `Plan`): Prefect runs them
in this process, and they never reach Prefect's API as parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.states import Cancelled, Completed, Failed

from alignflow import pipeline
from alignflow.errors import AlignflowError, RemoteJobError, RunCancelled
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.cached import reusable_steps
from alignflow.runner.engine import Verified
from alignflow.runner.run import finish, preflight_run, run_inputs, start_run
from alignflow.runner.session import RunOptions, StepOutcome
from alignflow.runner.steps import run_step
from alignflow.runview import RunView
from alignflow.store.records import RunStatus, StepStatus
from tasks.context import open_store, run_context, runner_for, state_dir, step_label
from tasks.progress import TaskReporter

PROGRESS_EVERY_S = 0.0  # every poll of a running job (the runner's 2 s): the terminal's display stays current
# Caching is alignflow's (the store decides by cache key and re-verified fingerprints), not Prefect's.
_COMMON: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}
CACHED = "Cached"  # the name Prefect's own cache gives a reused task result (its type stays COMPLETED)


def step_state(outcome: StepOutcome) -> StepOutcome | State[object]:
    """A reused step ends in Prefect's `Cached` state (Completed type) whose message names the run and the step run
    it was reused from, as the CLI's line does, so the UI tells reused steps from executed ones; a step that ran
    returns its outcome (`Completed`). Not this run's own record of the reuse (`step_run_id`): issue 47 read 'reused
    from run X (step run Y)' with Y the new run's record."""
    if outcome.status != StepStatus.CACHED:
        return outcome
    source = f"run {outcome.reused_from_run}" if outcome.reused_from_run else "the cache"
    detail = f" (step run {outcome.reused_from_step})" if outcome.reused_from_step else ""
    verdict = f"; verdict {outcome.verdict}" if outcome.verdict else ""
    return Completed(name=CACHED, message=f"reused from {source}{detail}{verdict}", data=outcome)


@task(name="start-run", task_run_name="start-run", **_COMMON)
def start_run_task(experiment: str, hosts: str, options: RunOptions) -> str | State[object]:
    """Validate the experiment and inventory, record a new run; returns its id. Bad parameters (a step the
    experiment does not have, an unknown parent run) end the task `Failed` with the reason - a user's input, not a
    crash: no traceback in the log - and calling it raises that error."""
    try:
        run_id = start_run(experiment, hosts, store=open_store(), state_dir=state_dir(), options=options)
    except AlignflowError as exc:
        return Failed(message=str(exc), data=exc)
    get_run_logger().info("run %s of %s started", run_id, experiment)
    return run_id


def record_run(experiment: str, hosts: str, options: RunOptions) -> str:
    """`start_run_task` called in a flow: the new run's id (its `Failed` state raises the AlignflowError)."""
    return cast(str, start_run_task(experiment, hosts, options))


@task(name="preflight", task_run_name="preflight", **_COMMON)
def preflight_task(run_id: str) -> pipeline.Plan:
    """Compare both sides' alignment-critical settings before anything runs (a mismatch fails the task, with no
    retry); returns the plan the run executes."""
    ctx = run_context(run_id)
    preflight_run(ctx, state_dir=state_dir(), events=get_run_logger().info)
    return ctx.plan


@task(name="data", task_run_name="data", **_COMMON)
def data_task(run_id: str) -> dict[str, ArtifactRef]:
    """Fingerprint (or generate, once for every run: `alignflow.once`) the data file both sides read, and the shared
    starting checkpoint if any."""
    say = TaskReporter(get_run_logger(), "data").message  # a wait for another run's data shows in the terminal too
    inputs = run_inputs(run_context(run_id), state_dir=state_dir(), events=say)
    for ref in inputs.values():
        get_run_logger().info("%s %s sha256 %s", ref.name, ref.path, ref.sha256)
    return inputs


# No Prefect retries: the core retries a step after a transient transport error, with a notice and a back-off that
# yields to Ctrl-C (alignflow.runner.retry); Prefect's slept in the task's thread, silently, up to five minutes.
@task(**_COMMON)
def step_task(run_id: str, step: str, available: Mapping[str, ArtifactRef],
              verified: frozenset[Verified] = frozenset()) -> StepOutcome | State[object]:
    """Run (or reuse) one pipeline step on its host; messages and progress go to the task log, a progress
    artifact and the process's observers (`tasks.progress`). A reused step ends in Prefect's `Cached` state
    naming the run it came from (`flows.states.step_state`); the task's result is the `StepOutcome` either way.
    `verified`: outputs this run already saw hash as recorded on their hosts (`cached_steps`), not hashed again."""
    reporter = TaskReporter(get_run_logger(), step_label(run_id, step))
    try:
        with runner_for(run_id, events=reporter.message, warnings=reporter.warning, progress=reporter.progress,
                        progress_every_s=PROGRESS_EVERY_S, verified=verified) as runner:
            outcome = run_step(runner, step, available)
    except BaseException as exc:
        cancelled = was_cancelled(run_id, exc)
        reporter.failed(exc, cancelled=cancelled)
        if cancelled and isinstance(exc, Exception):
            return Cancelled(message=f"{step}: {exc}".splitlines()[0])
        raise
    reporter.ended(outcome)
    return step_state(outcome)


def reusable_steps_of(run_id: str, plan: pipeline.Plan,
                      available: Mapping[str, ArtifactRef]) -> tuple[tuple[str, ...], frozenset[Verified]]:
    """The steps of the run that the store answers (`alignflow.runner.cached`), and the outputs verified on their
    hosts to say so; a plain function, not a task: the UI shows the steps themselves, `Cached`."""
    with runner_for(run_id, events=get_run_logger().debug) as runner:
        steps = reusable_steps(runner, plan, available)
        return steps, frozenset(runner.verified)


def was_cancelled(run_id: str, exc: BaseException) -> bool:
    """Whether a step ended by `exc` was cancelled rather than failed: interrupted, its job killed from outside (the
    run's cancellation: Ctrl-C, `alignflow cancel`, the UI's Cancel), or its run recorded cancelled meanwhile."""
    # RunCancelled: the step itself saw its run cancelled (in a retry's back-off: alignflow.runner.retry)
    if not isinstance(exc, Exception) or isinstance(exc, RunCancelled):
        return True
    if isinstance(exc, RemoteJobError) and getattr(exc.state, "kind", None) == "cancelled":
        return True
    try:
        return open_store().get_run(run_id).status == RunStatus.CANCELLED
    except AlignflowError:
        return False


@task(name="finish-run", task_run_name="finish-run", **_COMMON)
def finish_task(run_id: str, outcomes: Mapping[str, StepOutcome], error: str | None = None,
                failures: tuple[BaseException, ...] = (), verdict: str | None = None) -> RunView:
    """Close the run in the store (`failures`: the exceptions behind `error`, which tell a configuration or
    environment error from a failed step; `verdict`: a matrix run's); returns what `alignflow show` shows of it."""
    return finish(open_store(), run_id, outcomes, error=error, failures=failures, verdict=verdict)
