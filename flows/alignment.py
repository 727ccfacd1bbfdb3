"""The alignment flow: preflight, data, then the pipeline's DAG with one Prefect task per step.

The flow only wires tasks: the DAG walk is the core's (`alignflow.runner.walk.walk`, the same walker
`execute_pipeline` uses); here it submits each step as a Prefect task as soon as its upstream steps are done, so
`npu_reload_train` runs beside `convert_megatron` and the early gate.

What the UI shows comes from `flows.states`: the run's final state carries the verdict (`Completed`, `Not aligned`
or `Failed` with the cause), reused steps end `Cached`, runs are named `align-<experiment>-<run id>` and task
runs `<step> @ <host>`.

No `from __future__ import annotations` here: Prefect builds the UI form from the real annotations
(docs/orchestration.md#flow-parameters).
"""

import logging
import signal
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

from prefect import Flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.context import get_run_context
from prefect.futures import PrefectFuture, as_completed

from alignflow.config.experiment import experiment_name
from alignflow.errors import AlignflowError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.control import Canceller, cancel_interrupted, cancel_run_jobs
from alignflow.runner.engine import Verified
from alignflow.runner.session import RunOptions, StepOutcome
from alignflow.runner.walk import StepFuture, WalkResult, walk
from flows.artifacts import publish_matrix_artifacts, publish_run_artifacts
from flows.hooks import kill_remote_jobs, remember_run
from flows.states import flow_run_name, given_name, name_current_flow_run, not_started_state, run_state
from tasks.context import open_store, run_context, step_label, transport_factory
from tasks.matrix import matrix_verdict
from tasks.progress import announce_flow_run
from tasks.steps import data_task, finish_task, preflight_task, record_run, reusable_steps_of, step_task

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


def _flow_run_name() -> str:
    """The name from the parameters; a run recorded by the flow itself gets its run id once it exists. A name a
    person typed in the run form is kept (`flows.states.given_name`)."""
    from prefect.runtime import flow_run

    if (kept := given_name(flow_run.name)) is not None:
        return kept
    params = flow_run.parameters
    options = RunOptions(force=tuple(params.get("force") or ()), parent=params.get("parent_run"),
                         reproduce_of=params.get("reproduce_of"))
    return flow_run_name(experiment_name(str(params.get("experiment", "experiment"))), params.get("run_id"), options)


class TaskScheduler:
    """The walker's scheduler in a flow run: each step is a `step_task`, its task run named `<step> @ <host>`,
    submitted to the flow's task runner; a step of `reusable` (the store answers it: `alignflow.runner.cached`) is
    called in this thread instead, its outputs among `verified`: it only records and reports its reuse, and nothing
    is gained by a thread of its own and a future to wait on."""

    def __init__(self, run_id: str, reusable: Collection[str] = (), verified: frozenset[Verified] = frozenset()
                 ) -> None:
        self.run_id = run_id
        self.reusable = frozenset(reusable)
        self.verified = verified

    def submit(self, step: str, available: Mapping[str, ArtifactRef]) -> StepFuture:
        ctx = run_context(self.run_id)
        host = ctx.placement.host(step).name
        task = step_task.with_options(name=step, task_run_name=f"{step_label(self.run_id, step)} @ {host}")
        if step in self.reusable:
            called: Future[StepOutcome] = Future()
            try:
                state = task(self.run_id, step, dict(available), self.verified, return_state=True)
                called.set_result(cast(StepOutcome, state.result()))  # a Cached state's data, or its error raised
            except Exception as exc:  # the walk reports it, as it reports a submitted step's
                called.set_exception(exc)
            return called
        # The task returns a `Cached` state for a reused step; the future's result is the state's data either way.
        return cast(PrefectFuture[StepOutcome], task.submit(self.run_id, step, dict(available)))

    def first_done(self, futures: Iterable[StepFuture]) -> StepFuture:
        pending = list(futures)
        called = next((f for f in pending if isinstance(f, Future)), None)
        if called is not None:
            return called
        return next(as_completed(cast(list[PrefectFuture[StepOutcome]], pending)))


class JSONParametersFlow(Flow[P, R]):
    """A flow whose parameters are sent to Prefect as they are when they are JSON already (strings, lists of
    strings, booleans, None: the alignment flow's, as `alignflow run` and the nightly flow pass them). Prefect encodes
    each with FastAPI's `jsonable_encoder`, which leaves such values as they are and costs a run FastAPI's import, a
    tenth of a second (issue 48); anything else still goes through it."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        if all(_is_json(value) for value in parameters.values()):
            return dict(parameters)
        return super().serialize_parameters(parameters)


def json_parameters_flow(**options: Any) -> Callable[[Callable[P, R]], JSONParametersFlow[P, R]]:
    """`@flow(**options)`, the flow a `JSONParametersFlow`."""
    def wrap(fn: Callable[P, R]) -> JSONParametersFlow[P, R]:
        return JSONParametersFlow(fn, **options)

    return wrap


def _is_json(value: object) -> bool:
    if value is None or type(value) in (str, bool, int):  # exact types: an Enum or a str subclass is encoded
        return True
    return type(value) is list and all(_is_json(v) for v in cast(list[object], value))


@json_parameters_flow(
    name="alignment",
    flow_run_name=_flow_run_name,
    on_cancellation=[kill_remote_jobs],
    on_crashed=[kill_remote_jobs],
    log_prints=True,
)
def alignment(
    experiment: str,
    hosts: str = "hosts.yaml",
    from_step: str | None = None,
    only: list[str] | None = None,
    force: list[str] | None = None,
    parent_run: str | None = None,
    reuse_parent: bool = False,
    reproduce_of: str | None = None,
    trigger: str = "prefect",
    run_id: str | None = None,
) -> State[object]:
    """Run one alignment experiment end to end; its final state carries the verdict (`flows.states`), its result
    is the run record (`alignflow show --json`, a `RunView` as JSON).

    `run_id` continues a run already recorded by the caller (the CLI records it first so that it can always
    report on it); otherwise the flow records a new run from the other parameters.
    """
    logger = get_run_logger()
    if run_id is None:
        options = RunOptions(from_step=from_step, only=tuple(only or ()), force=tuple(force or ()),
                             parent=parent_run, trigger=trigger, reuse_parent=reuse_parent, reproduce_of=reproduce_of)
        try:
            run_id = record_run(str(Path(experiment)), str(Path(hosts)), options)
        except AlignflowError as exc:  # bad parameters (an unknown parent run...): nothing was recorded
            logger.error("not started: %s", exc)
            return not_started_state(exc)
    ctx = run_context(run_id)
    name = name_current_flow_run(flow_run_name(ctx.experiment.name, run_id, ctx.options), logger)
    logger = get_run_logger()  # with the name the run now has
    remember_run(get_run_context(), run_id)
    announce_flow_run(name, flow_run_link())
    result = WalkResult({}, ())
    error: str | None = None
    failures: tuple[BaseException, ...] = ()  # what decides between `error` and `failed` (runner.run.failure_status)
    verdict: str | None = None
    try:
        with _sigterm_cancels(run_id):
            plan = preflight_task(run_id)  # before step 1: a configuration mismatch fails the run with nothing run
            inputs = data_task(run_id)  # the data, and the shared starting checkpoint when the experiment gives one
            reusable, verified = reusable_steps_of(run_id, plan, inputs)  # every fingerprint checked, host by host
            result = walk(plan, inputs, TaskScheduler(run_id, reusable, verified))
            error, failures = result.error, tuple(f.exception for f in result.failures)
            if error is None and ctx.experiment.variants is not None:
                # the switch matrix: a child run per training, its steps Prefect tasks like the run's own
                verdict = matrix_verdict(run_id, result, inputs, TaskScheduler, logger.info)
    except AlignflowError as exc:
        error, failures = str(exc), (exc,)
    except Exception as exc:  # a task failed: Prefect re-raises the original error
        error, failures = f"{type(exc).__name__}: {exc}", (exc,)
    except KeyboardInterrupt as exc:  # a second Ctrl-C in `alignflow run`: the run ends cancelled, here and in Prefect
        logger.warning("run %s: Ctrl-C, cancelling it (its jobs are killed)", run_id)
        cancel_interrupted(open_store(), run_id, exc, transport_factory=transport_factory(), why="stopped by Ctrl-C")
        error = "stopped by Ctrl-C"
    except BaseException as exc:  # TerminationSignal: a second SIGTERM, or a flow run outside the main thread
        cancel_interrupted(open_store(), run_id, exc, transport_factory=transport_factory(), what="the flow run")
        raise
    view = finish_task(run_id, result.outcomes, error=error, failures=failures, verdict=verdict)
    if view.status in ("failed", "error"):
        logger.error("run %s %s: %s", run_id, view.status, error)
    publish_run_artifacts(view)
    if ctx.experiment.variants is not None:
        publish_matrix_artifacts(run_id)
    logger.info("run %s: %s, verdict %s, report %s", run_id, view.status, view.verdict, view.report)
    return run_state(view)


SIGTERM_WHY = "stopped (SIGTERM)"


@contextmanager
def _sigterm_cancels(run_id: str) -> Iterator[None]:
    """While inside (in the main thread): the first SIGTERM (`alignflow cancel`, systemd, the Prefect runner
    cancelling a flow run from the UI) cancels the run through the runner's one path, in a thread of its own
    (`Canceller`); the steps see their jobs end and the flow returns `Cancelled`. Prefect's own handler raised
    TerminationSignal wherever the main thread was, and the flow run ended `Crashed` with "Crash detected!" (issue
    45). A second SIGTERM goes to Prefect's handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def cancel(why: str) -> list[str]:
        return cancel_run_jobs(open_store(), run_id, transport_factory=transport_factory(), why=why)

    canceller = Canceller(run_id, cancel)
    previous: Any = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        if canceller.why is not None and callable(previous):
            previous(signum, frame)
        canceller.request(SIGTERM_WHY)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        canceller.close()


def flow_run_link() -> str | None:
    """The UI page of the flow run this code runs in."""
    from prefect.runtime import flow_run

    from flows.prefect_client import run_link

    return run_link(flow_run.id) if flow_run.id else None
