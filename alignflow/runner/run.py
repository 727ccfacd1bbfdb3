"""Run-level operations: start a run (recording everything needed to reproduce it), preflight it, walk its
pipeline without Prefect, finish it, and describe it (`alignflow show`).

The Prefect flow composes these same functions with one task per step (`flows.alignment`); `execute_pipeline` is
the plain-Python walk of the same DAG, through the same `walk` (benchmarks, the core's own tests).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue, ValidationError

from alignflow import pipeline
from alignflow.codeversion import alignflow_version
from alignflow.config.experiment import Experiment
from alignflow.config.placement import place
from alignflow.errors import (
    AlignflowError,
    ConfigError,
    FingerprintMismatch,
    ImmutableRecord,
    PathMissing,
    PathNotAllowed,
    PipelineError,
    PreflightError,
    RecordNotFound,
    StoreError,
    TransportError,
)
from alignflow.fingerprint import HashMemo
from alignflow.preflight import PreflightReport, check_experiment
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.control import cancel_interrupted
from alignflow.runner.engine import DEFAULT_BACKOFF, StepRunner, TransportFactory
from alignflow.runner.gate import GateFailed
from alignflow.runner.retry import Backoff
from alignflow.runner.session import (
    Events,
    RunContext,
    RunOptions,
    StepOutcome,
    load_run_inputs,
    open_run,
    plan_for,
    prepare_base,
    prepare_data,
)
from alignflow.runner.steps import run_step
from alignflow.runner.walk import ThreadScheduler, WalkResult, walk
from alignflow.runview import NOT_SELECTED, RunView, run_view
from alignflow.store import Store
from alignflow.store.params import RunParams
from alignflow.store.records import RunStatus, StepStatus

if TYPE_CHECKING:
    from alignflow.runner.matrix import SchedulerFor

log = logging.getLogger(__name__)


def start_run(
    experiment_path: str | Path,
    hosts_path: str | Path,
    *,
    store: Store,
    state_dir: Path,
    options: RunOptions | None = None,
    experiment_update: Mapping[str, Mapping[str, JsonValue]] | None = None,
) -> str:
    """Validate the inputs, record the experiment and a new run, return the run id.

    With `options.recorded_from`, the experiment and inventory are the ones recorded by that run (not the files
    as they are now); `options.reproduce_of` does the same and forces every step, so that the new run's
    fingerprints can be compared with the old. `experiment_update` changes sections of the experiment for this run
    (`{"diagnose": {"step": 5}}`), recorded as part of its experiment.
    """
    options = options or RunOptions()
    if options.reproduce_of is not None:
        old = open_run(store, options.reproduce_of)
        options = RunOptions(parent=options.reproduce_of, trigger=options.trigger, reproduce_of=options.reproduce_of,
                             recorded_from=options.reproduce_of,
                             force=tuple(s.name for s in old.pipeline.steps if not s.optional))
    if options.recorded_from is not None:
        recorded = open_run(store, options.recorded_from).params
        experiment, inventory = recorded.experiment, recorded.inventory
        experiment_path, hosts_path = recorded.experiment_path, recorded.hosts_path
    else:
        experiment, inventory = load_run_inputs(experiment_path, hosts_path, state_dir)
    if experiment_update:
        experiment = updated(experiment, experiment_update)
    if options.parent is not None:
        check_parent(store, options.parent, experiment.name)
    plan = plan_for(experiment, options)
    config = experiment.model_dump(mode="json")
    config_sha = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    store.ensure_experiment(experiment.name, config=config, config_sha256=config_sha)
    params = RunParams(
        experiment_path=str(Path(experiment_path).resolve()), hosts_path=str(Path(hosts_path).resolve()),
        state_dir=str(state_dir), experiment=experiment, inventory=inventory, options=options,
        plan=plan, placement=place(experiment, inventory, state_dir=state_dir))
    # the run's own configuration, not the experiment's newest: a file edited back and forth records each run
    # under the config it ran, and history / the nightly tell runs of another configuration by it
    run = store.create_run(experiment.name, parent_id=options.parent, trigger=options.trigger,
                           code_version=f"alignflow {alignflow_version()}", params=params, config_sha256=config_sha)
    return run.id


def updated(experiment: Experiment, update: Mapping[str, Mapping[str, JsonValue]]) -> Experiment:
    """`experiment` with some of its sections' fields replaced, validated again."""
    doc = experiment.model_dump(mode="json")
    for section, fields in update.items():
        doc[section] = {**(doc.get(section) or {}), **fields}
    try:
        return Experiment.model_validate(doc).model_copy(update={"source": experiment.source})
    except ValidationError as exc:
        raise ConfigError(f"{experiment.source}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None


def check_parent(store: Store, parent: str, experiment: str) -> None:
    """The parent a run names exists and is a run of the same experiment (a re-run reuses its artifacts): a
    clear error naming the recent runs of `experiment` otherwise (the Prefect form takes the id as text)."""
    try:
        found = store.get_run(parent)
    except RecordNotFound as exc:
        raise ConfigError(f"parent run: {exc}; {recent_runs_text(store, experiment)}") from None
    if found.experiment != experiment:
        raise ConfigError(f"parent run {found.id} is a run of {found.experiment!r}, not of {experiment!r}; "
                          f"{recent_runs_text(store, experiment)}")


def recent_runs_text(store: Store, experiment: str, limit: int = 5) -> str:
    """`recent runs of demo: 3f2a9c1b0d4e (pass, 2026-11-02 02:00), ...` or that there are none."""
    try:
        runs = store.list_runs(experiment=experiment, limit=limit)
    except RecordNotFound:
        runs = []
    if not runs:
        return f"{experiment!r} has no recorded run yet"
    shown = ", ".join(f"{r.id} ({r.verdict or r.status}, {r.started_at:%Y-%m-%d %H:%M})" for r in runs)
    return f"recent runs of {experiment!r}: {shown}"


def preflight_run(ctx: RunContext, *, state_dir: Path, events: Events | None = None,
                  transport_factory: TransportFactory | None = None) -> PreflightReport | None:
    """Preflight of a recorded run (its experiment and inventory as recorded), before any step: a mismatch raises
    `PreflightError` listing every difference, so the run fails with that list as its error and nothing runs.

    The report is kept beside the run's logs (`runs/<id>/preflight.json`) whatever the outcome. The run's Slurm
    hosts are checked too (client tools, sacct, controller, partition): only those are contacted.
    """
    check_slurm_hosts(ctx, events=events, transport_factory=transport_factory)
    experiment = ctx.experiment
    if not experiment.preflight:
        (events or log.warning)(f"preflight: turned off by {experiment.source} (preflight: false); both sides' "
                                "settings were NOT compared")
        return None
    from alignflow.transport import open_transport

    # a side's host is probed only when this run trains that side there (`--only npu_base_train` probes no GPU host)
    sides = {side for step in executed_steps(ctx.plan) for side in _sides_trained(ctx, step)}
    report = check_experiment(experiment, placement=ctx.placement, transport_factory=open_transport if sides else None,
                              probe_sides=sides)
    out = state_dir / "runs" / ctx.run_id / "preflight.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
    if not report.ok:
        raise PreflightError(f"{report.summary()}\nnothing was run; `alignflow preflight {experiment.source}` lists "
                             "every setting with its source", report=report)
    (events or log.info)(report.summary())
    return report


def executed_steps(plan: pipeline.Plan) -> tuple[str, ...]:
    """The steps a run may execute: its plan without the reuse-only steps (upstream of `--only`, which only
    supply their recorded outputs)."""
    return tuple(s for s in plan.steps if s not in plan.reuse_only)


def _sides_trained(ctx: RunContext, step: str) -> tuple[pipeline.Side, ...]:
    """The sides whose training `step` runs on their hosts: a training's own, both for the executors that train both
    sides (the early gate, the diagnosis), none for the others."""
    spec = ctx.pipeline.step(step)
    if spec.side is not None:
        return (spec.side,)
    return pipeline.SIDE_NAMES if spec.executor in ("gate", "diagnose") else ()


def check_slurm_hosts(ctx: RunContext, *, events: Events | None = None,
                      transport_factory: TransportFactory | None = None) -> None:
    """`PreflightError` when a Slurm host of the run's plan cannot run its jobs (`alignflow.transport.slurm_check`)."""
    from alignflow.transport import open_transport
    from alignflow.transport.slurm_check import check_slurm_host

    hosts = {h.name: h for step in executed_steps(ctx.plan) if ctx.pipeline.step(step).executor != "compare"
             for h in [ctx.placement.host(step)] if h.scheduler == "slurm"}
    errors: list[str] = []
    for host in hosts.values():
        t = (transport_factory or open_transport)(host)
        try:
            check = check_slurm_host(t.shell)
            errors += check.errors
            for warning in check.warnings:
                (events or log.warning)(f"preflight: {warning}")
        finally:
            t.close()
    if errors:
        raise PreflightError("preflight: " + "\n".join(errors) + "\nnothing was run", report=None)


def data_artifact(ctx: RunContext, *, state_dir: Path) -> ArtifactRef:
    """The run's data file on the controller, fingerprinted (or generated, for the twin)."""
    return run_inputs(ctx, state_dir=state_dir)["data"]


def run_inputs(ctx: RunContext, *, state_dir: Path, events: Events | None = None) -> dict[str, ArtifactRef]:
    """What the run takes from outside, on the controller, fingerprinted: the data (generated for the twin) and
    the shared starting checkpoint when the experiment gives one (`base_ckpt`). What is generated is made by one
    run while the others wait, saying so through `events`."""
    memo = HashMemo(state_dir / "hashmemo.sqlite")
    try:
        inputs = {"data": prepare_data(ctx.experiment, memo=memo, run_id=ctx.run_id, events=events)}
        base = prepare_base(ctx.experiment, memo=memo, run_id=ctx.run_id, events=events)
        return inputs | ({"base_ckpt": base} if base is not None else {})
    finally:
        memo.close()


SETUP_ERRORS: tuple[type[AlignflowError], ...] = (
    ConfigError, PreflightError, TransportError, PathNotAllowed, PathMissing, FingerprintMismatch, StoreError,
    PipelineError)
"""Failures of a run's configuration or environment: a file or name that is wrong, the two sides' settings apart
before anything ran, a host that cannot be reached or used, data or a copy whose sha256 is not the one declared,
the store, a step asked for that cannot run (`--only` with nothing to reuse). The run ends `error`: it says
nothing about the alignment. Everything else (a training that crashed, a conversion that refused the weights, a
log with a fatal line) is a failure of a step: `failed`. The early gate's `GateFailed` is an alignment verdict."""


def failure_status(failures: Sequence[BaseException]) -> tuple[RunStatus, str | None]:
    """The status and verdict of a run that stopped on `failures`: `error` (no verdict) when every one is of the
    configuration or environment (`SETUP_ERRORS`); else `failed`, with verdict `fail` only when the early gate
    found the two sides apart (the one failure that is a finding about the alignment)."""
    if any(isinstance(f, GateFailed) for f in failures):
        return RunStatus.FAILED, "fail"
    if failures and all(isinstance(f, SETUP_ERRORS) for f in failures):
        return RunStatus.ERROR, None
    return RunStatus.FAILED, None


def finish(store: Store, run_id: str, outcomes: Mapping[str, StepOutcome], *, error: str | None = None,
           failures: Sequence[BaseException] = (), verdict: str | None = None) -> RunView:
    """Close the run: status, verdict, report; steps that never ran are recorded as skipped. `failures`: the
    exceptions behind `error`, which decide between `error` and `failed` (`failure_status`). A run with a step
    cancelled from outside (its job killed by `cancel_run_jobs`) is cancelled, without a verdict, as that cancel
    records it; when the cancel has recorded the run already, its record stands. `verdict` is a verdict that does
    not come from the run's compare step (a matrix's, a variant's against its reference)."""
    try:
        return _finish(store, run_id, outcomes, error=error, failures=failures, verdict=verdict)
    except ImmutableRecord:
        if store.get_run(run_id).status != RunStatus.CANCELLED:
            raise
        return show(store, run_id)


def _finish(store: Store, run_id: str, outcomes: Mapping[str, StepOutcome], *, error: str | None,
            failures: Sequence[BaseException], verdict: str | None) -> RunView:
    plan = open_run(store, run_id).plan
    steps = store.steps(run_id)
    recorded = {s.step for s in steps}
    for spec in plan.pipeline.steps:
        name = spec.name
        if name not in recorded and (name in plan.steps or not spec.optional):
            store.skip_step(run_id, name, reason="not reached: an earlier step failed" if error and name in plan.steps
                            else NOT_SELECTED)
    compare = outcomes.get("compare")
    if verdict is None:
        verdict = compare.verdict if compare is not None else None
    report = None
    if compare is not None and "report" in compare.artifacts:
        report = str(Path(compare.artifacts["report"].path) / "report.html")
    if any(s.status == StepStatus.CANCELLED for s in steps):
        status, verdict = RunStatus.CANCELLED, None
    elif error:
        status, failed_verdict = failure_status(failures)
        verdict = verdict or failed_verdict
    else:
        status = RunStatus.COMPLETED
    store.finish_run(run_id, status=status, verdict=verdict, report=report, error=error)
    return show(store, run_id)


def show(store: Store, run_id: str) -> RunView:
    """The recorded run as `alignflow show` prints it (`RunView.model_dump(mode="json")` is `show --json`)."""
    return run_view(store, run_id)


def execute_pipeline(
    run_id: str, *, store: Store, state_dir: Path, transport_factory: TransportFactory, events: Events | None = None,
    workers: int = 4, controller: TransportFactory | None = None, backoff: Backoff = DEFAULT_BACKOFF,
) -> RunView:
    """Walk the run's plan without Prefect, steps in threads (the flow does the same with tasks).

    `controller`: the controller's own transport (default: its real filesystem; see `StepRunner`); `backoff`: how a
    step is retried after a transient transport error (`alignflow.runner.retry`)."""
    ctx = open_run(store, run_id)
    try:
        preflight_run(ctx, state_dir=state_dir, events=events, transport_factory=transport_factory)
        inputs = run_inputs(ctx, state_dir=state_dir, events=events)
    except AlignflowError as exc:
        return finish(store, run_id, {}, error=str(exc), failures=(exc,))

    schedulers: list[ThreadScheduler] = []

    def steps_of(run: str) -> ThreadScheduler:
        """A scheduler running the steps of run `run` (this one, or a child of its matrix) in threads."""
        child = ctx if run == run_id else open_run(store, run)

        def run_one(step: str, available: Mapping[str, ArtifactRef]) -> StepOutcome:
            runner = StepRunner(child, store=store, state_dir=state_dir, transport_factory=transport_factory,
                                events=events, controller=controller, backoff=backoff, warnings=events)
            try:
                return run_step(runner, step, available)
            finally:
                runner.close()

        schedulers.append(ThreadScheduler(run_one, workers=workers))
        return schedulers[-1]

    scheduler = steps_of(run_id)
    try:
        result = walk(ctx.plan, inputs, scheduler)
    except BaseException as exc:  # interrupted: kill the jobs still running (their threads then end)
        cancel_interrupted(store, run_id, exc, transport_factory=transport_factory)
        raise
    finally:
        scheduler.close()
    if ctx.experiment.variants is None or result.error is not None:
        return finish(store, run_id, result.outcomes, error=result.error,
                      failures=tuple(f.exception for f in result.failures))
    try:
        verdict = matrix_of(run_id, result, inputs, store=store, state_dir=state_dir,
                            transport_factory=transport_factory, scheduler_for=steps_of, events=events,
                            controller=controller)
    except AlignflowError as exc:
        return finish(store, run_id, result.outcomes, error=f"matrix: {exc}", failures=(exc,))
    except BaseException as exc:  # interrupted during the matrix: its runs' jobs are killed, the run cancelled
        cancel_interrupted(store, run_id, exc, transport_factory=transport_factory)
        raise
    finally:
        for each in schedulers:
            each.close()
    return finish(store, run_id, result.outcomes, verdict=verdict)


def matrix_of(run_id: str, result: WalkResult, available: Mapping[str, ArtifactRef], *, store: Store,
              state_dir: Path, transport_factory: TransportFactory, scheduler_for: SchedulerFor,
              events: Events | None = None, controller: TransportFactory | None = None) -> str:
    """Train and compare the switch matrix of a run whose pipeline has run (`alignflow.runner.matrix`); the run's
    verdict: its reference's alignment and the matrix both passing."""
    from alignflow.runner.matrix import combined_verdict, run_matrix

    artifacts = dict(available)
    for outcome in result.outcomes.values():
        artifacts.update(outcome.artifacts)
    matrix = run_matrix(run_id, artifacts, store=store, state_dir=state_dir, transport_factory=transport_factory,
                        scheduler_for=scheduler_for, finish=finish, events=events, controller=controller)
    return combined_verdict(result.outcomes, matrix.result)
