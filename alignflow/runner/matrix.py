"""A matrix run: the trainings of every config of every group, then the comparison, recorded with the run.

The run of an experiment with `variants:` walks its pipeline as any run does — the reference's base training,
conversions, both trainings and its NPU-vs-GPU comparison. Then `run_matrix`:

1. records one child run per training of the matrix (parent = the run, trigger `matrix`, the experiment name
   `<experiment>/<config>` or `<experiment>/<group>/<config>`): each variant of each group, and the reference of
   each declared group (without groups, the reference is the run itself). A child's plan is the two trainings;
   they start from the run's data and converted checkpoints (every training of the matrix starts from the same
   weights, seed 004's "same DCP path"), whatever the patch says about the base training;
2. walks every child's plan through the scheduler it is given (threads here, Prefect tasks in the flow), all at
   once: how many trainings really run side by side is each host's job slots. A training whose cache key equals
   one already done — the reference's side that a variant does not change, a twice-declared config — is reused by
   its fingerprint (the run's own step first, `reuse_parent`), never trained twice;
3. reads each training's end (completed, OOM, failed, exit code unknown; `status.py`), its log and its memory
   lines, compares each variant with its group's reference (`compare.py`), writes the report (`report.py`) and
   records the result (`store.add_matrix`); each child run ends with its variant's verdict.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.codeversion import alignflow_version
from alignflow.config.criteria import Criterion
from alignflow.config.experiment import Experiment, variant_experiment
from alignflow.config.placement import place
from alignflow.config.variants import DEFAULT_GROUP
from alignflow.errors import AlignflowError, ConfigError
from alignflow.matrix.compare import ConfigTrainings, MatrixResult, SideTraining, compare_matrix
from alignflow.matrix.memory import parse_memory
from alignflow.matrix.report import MatrixFiles, write_matrix_report
from alignflow.matrix.status import classify
from alignflow.pipeline import Plan
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.engine import StepRunner, TransportFactory
from alignflow.runner.session import Events, RunContext, RunOptions, StepOutcome, open_run
from alignflow.runner.trainings import SIDE_STEP, SIDES, training_log
from alignflow.runner.walk import Scheduler, WalkResult, walk
from alignflow.store import Store

log = logging.getLogger(__name__)

TRAININGS = tuple(SIDE_STEP[side].name for side in SIDES)
# what every training of the matrix starts from: the run's own data and converted checkpoints
STARTING_POINT = ("data", "bf16_ckpt", "megatron_ckpt")
SchedulerFor = Callable[[str], Scheduler[Any]]


@dataclass(frozen=True, slots=True)
class MatrixTraining:
    """One training of the matrix: a config of a group, and the run that trains it."""

    group: str
    config: str
    run_id: str
    own: bool = False  # the matrix run itself (the reference of the implicit group)


@dataclass(frozen=True, slots=True)
class MatrixOutcome:
    result: MatrixResult
    files: MatrixFiles
    trainings: tuple[MatrixTraining, ...]


def matrix_trainings(ctx: RunContext) -> list[tuple[str, str, Experiment | None]]:
    """(group, config, experiment) of every training the matrix needs; experiment None: the run itself."""
    matrix = ctx.experiment.variants
    assert matrix is not None
    out: list[tuple[str, str, Experiment | None]] = []
    for group in matrix.group_names:
        grouped = bool(matrix.groups)
        out.append((group, matrix.reference,
                    variant_experiment(ctx.experiment, group, None) if grouped else None))
        out += [(group, name, variant_experiment(ctx.experiment, group, name)) for name in matrix.configs_in(group)]
    return out


def check_trainings(ctx: RunContext, trainings: list[tuple[str, str, Experiment | None]], *, state_dir: Path
                    ) -> None:
    """Render every training's command on its host before any starts: a variant whose layout the host cannot hold
    (dp 2 on a host of 1 device), or whose flags its side refuses, fails the matrix now, every problem listed."""
    from alignflow.backends.commands import step_command

    problems = []
    for group, config, experiment in trainings:
        if experiment is None:
            continue
        for step in TRAININGS:
            try:
                host = place(experiment, ctx.inventory, state_dir=state_dir, steps=(step,)).host(step)
                step_command(experiment, step, data_sha256="", host=host)
            except AlignflowError as exc:
                where = f" in group {group}" if group != DEFAULT_GROUP else ""
                problems.append(f"{config}{where}: {step}: {exc}")
    if problems:
        raise ConfigError("the matrix cannot run (nothing of it was started):\n" + "\n".join(problems))


def start_children(store: Store, ctx: RunContext, *, state_dir: Path) -> list[MatrixTraining]:
    """Record the child run of every training of the matrix (before any of them starts)."""
    out = []
    plan = Plan(steps=tuple(TRAININGS), forced=frozenset())
    options = RunOptions(parent=ctx.run_id, trigger="matrix", reuse_parent=True)
    trainings = matrix_trainings(ctx)
    check_trainings(ctx, trainings, state_dir=state_dir)
    for group, config, experiment in trainings:
        if experiment is None:
            out.append(MatrixTraining(group, config, ctx.run_id, own=True))
            continue
        doc = experiment.model_dump(mode="json")
        sha = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        store.ensure_experiment(experiment.name, config=doc, config_sha256=sha)
        # the child's parent, trigger and experiment name (`<matrix>/<config>`) tell which training it is
        params = ctx.params.model_copy(update={
            "experiment": experiment, "options": options, "plan": plan, "state_dir": str(state_dir),
            "placement": place(experiment, ctx.inventory, state_dir=state_dir)})
        run = store.create_run(experiment.name, parent_id=ctx.run_id, trigger="matrix",
                               code_version=f"alignflow {alignflow_version()}", params=params, config_sha256=sha)
        out.append(MatrixTraining(group, config, run.id))
    return out


def walk_children(children: list[MatrixTraining], available: Mapping[str, ArtifactRef], *,
                  scheduler_for: SchedulerFor, store: Store, on_interrupt: Callable[[BaseException], None]
                  ) -> dict[str, WalkResult]:
    """Walk every child's plan at once (one thread per child, each submitting its steps through its scheduler);
    the walks' results by run id. Interrupted (Ctrl-C, a cancelled flow run), `on_interrupt` kills the children's
    jobs first, so that their walks end and the threads can be joined."""
    start = {k: v for k, v in available.items() if k in STARTING_POINT}
    todo = [c for c in children if not c.own]
    results: dict[str, WalkResult] = {}
    if not todo:
        return results
    pool = ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="alignflow-matrix")
    try:
        futures: dict[Future[WalkResult], MatrixTraining] = {}
        for child in todo:
            plan = open_run(store, child.run_id).plan
            # each thread runs in a copy of this context (a Prefect flow run's, so that its tasks belong to it)
            ctx = contextvars.copy_context()
            futures[pool.submit(ctx.run, walk, plan, dict(start), scheduler_for(child.run_id))] = child
        for future, child in futures.items():
            results[child.run_id] = future.result()
    except BaseException as exc:
        on_interrupt(exc)
        raise
    finally:
        pool.shutdown(wait=True)
    return results


FinishRun = Callable[..., object]
"""`finish(store, run_id, outcomes, *, error, verdict, failures)`: how a child run is closed
(`alignflow.runner.run.finish`)."""


def run_matrix(run_id: str, available: Mapping[str, ArtifactRef], *, store: Store, state_dir: Path,
               transport_factory: TransportFactory, scheduler_for: SchedulerFor, finish: FinishRun,
               events: Events | None = None, controller: TransportFactory | None = None) -> MatrixOutcome:
    """Train and compare the matrix of run `run_id` (its pipeline has run; `available`: its artifacts); each child
    run is closed with `finish` and its variant's verdict."""
    from alignflow.runner.control import cancel_interrupted

    say = events or (lambda msg: log.info("%s", msg))
    ctx = open_run(store, run_id)
    children = start_children(store, ctx, state_dir=state_dir)
    matrix = ctx.experiment.variants
    assert matrix is not None, f"run {run_id} has no matrix"
    say(f"matrix: {len(children) - sum(c.own for c in children)} run(s) for {len(matrix.configs)} variant(s) and "
        f"the reference{'s' if matrix.groups else ''}")

    def interrupted(exc: BaseException) -> None:
        for child in children:
            if not child.own:
                cancel_interrupted(store, child.run_id, exc, transport_factory=transport_factory, what="the matrix")

    walks = walk_children(children, available, scheduler_for=scheduler_for, store=store, on_interrupt=interrupted)
    runner = StepRunner(ctx, store=store, state_dir=state_dir, transport_factory=transport_factory, events=events,
                        controller=controller)
    try:
        trainings = collect(children, store=store, runner=runner, state_dir=state_dir,
                            errors={k: w.error for k, w in walks.items() if w.error})
    finally:
        runner.close()
    criteria: list[Criterion] = list(matrix.criteria or ctx.experiment.criteria)
    result = compare_matrix(matrix, trainings, criteria=criteria, experiment=ctx.experiment.name)
    files = write_matrix_report(result, state_dir / "reports" / f"{run_id}-matrix")
    store.add_matrix(run_id, verdict=result.verdict, summary=result.to_json(), report=str(files.html))
    verdicts = {(v.group, v.name): v.verdict for v in result.variants}
    for child in children:
        if child.own:
            continue
        walked = walks.get(child.run_id, WalkResult({}, ()))
        reference = child.config == matrix.reference
        verdict = None if reference else verdicts.get((child.group, child.config))
        finish(store, child.run_id, walked.outcomes, error=walked.error, verdict=verdict,
               failures=tuple(f.exception for f in walked.failures))
    say(f"matrix: verdict {result.verdict} — report {files.html}")
    return MatrixOutcome(result, files, tuple(children))


def collect(children: list[MatrixTraining], *, store: Store, runner: StepRunner, state_dir: Path,
            errors: Mapping[str, str] | None = None) -> dict[str, dict[str, ConfigTrainings]]:
    """Every training's end, log and memory, by group and config (`errors`: each child walk's error, the reason
    of a training that never started)."""
    from alignflow.logs.parse import parse_log
    from alignflow.runview import step_timing

    out: dict[str, dict[str, ConfigTrainings]] = {}
    logs_dir = state_dir / "runs" / runner.run_id / "matrix"
    for child in children:
        sides: dict[str, SideTraining] = {}
        for side in SIDES:
            found = training_log(store, runner, child.run_id, side, local_dir=logs_dir)
            record = found.record
            status = classify(step_status=record.status.value if record else None,
                              exit_code=record.exit_code if record else None,
                              error=record.error if record else (errors or {}).get(child.run_id),
                              texts=[record.stderr_tail or "", record.stdout_tail or "", found.text] if record
                              else [found.text], step_run_id=record.id if record else None)
            parsed = None
            if found.text:
                try:
                    parsed = parse_log(found.text.splitlines(), source=f"{child.run_id}:{SIDE_STEP[side].name}")
                except AlignflowError:  # no step lines (an OOM before step 1): the status says why
                    parsed = None
            sides[side] = SideTraining(status=status, parsed=parsed, memory=parse_memory(found.text.splitlines()),
                                       identity=found.origin_step_run if status.completed else None,
                                       run_id=child.run_id,
                                       timing=step_timing(store, record, child.run_id)
                                       if record is not None and found.completed else None)
        out.setdefault(child.group, {})[child.config] = ConfigTrainings(child.config, sides, child.run_id)
    return out


def combined_verdict(outcomes: Mapping[str, StepOutcome], matrix: MatrixResult) -> str:
    """The verdict of a matrix run: its reference's NPU-vs-GPU alignment and the matrix, both passing."""
    compare = outcomes.get("compare")
    aligned = compare is None or compare.verdict == "pass"
    return "pass" if aligned and matrix.verdict == "pass" else "fail"


__all__ = ["MatrixOutcome", "MatrixTraining", "combined_verdict", "run_matrix"]
