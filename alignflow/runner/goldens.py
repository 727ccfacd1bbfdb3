"""Golden values of recorded runs: record a run's sides (and its matrix's variants) as goldens, check them.

Reads each side's training log the way the matrix does (`alignflow.runner.trainings`) and judges it with the pure
`alignflow.golden`; `alignflow golden` (the CLI) and the nightly (`tasks.regression`) call these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from alignflow.config.golden import Margin
from alignflow.errors import AlignflowError, ConfigError, RecordNotFound
from alignflow.golden import GoldenCheck, OutOfMargin, SideCheck, Values, check_side, values_of
from alignflow.matrix.memory import parse_memory
from alignflow.runner.engine import StepRunner, TransportFactory
from alignflow.runner.session import open_run
from alignflow.runner.trainings import SIDE_STEP, SIDES, TrainingLog, training_log
from alignflow.store.records import StepStatus

if TYPE_CHECKING:
    from alignflow.store import Store
    from alignflow.store.records import GoldenRecord


def runs_of(store: Store, run_id: str) -> list[str]:
    """A run, then the child runs of its switch matrix (each variant is an experiment of its own)."""
    run = store.get_run(run_id)
    return [run.id, *(c.id for c in store.children(run.id) if c.trigger == "matrix")]


def _trainings(store: Store, run_id: str, sides: Sequence[str], runner_for: Callable[[str], StepRunner],
               local_dir: Path) -> list[tuple[str, TrainingLog]]:
    out = []
    for rid in runs_of(store, run_id):
        runner = runner_for(rid)
        try:
            out += [(rid, training_log(store, runner, rid, side, local_dir=local_dir)) for side in sides]
        finally:
            runner.close()
    return out


def _values(found: TrainingLog) -> Values:
    from alignflow.logs.parse import parse_log

    parsed = parse_log(found.text.splitlines(), source=f"{found.record.run_id if found.record else ''}:{found.side}")
    return values_of(parsed, parse_memory(found.text.splitlines()))


def record_goldens(store: Store, run_id: str, *, sides: Sequence[str] = SIDES,
                   runner_for: Callable[[str], StepRunner], local_dir: Path, note: str | None = None
                   ) -> list[GoldenRecord]:
    """Record the completed trainings of `run_id` (and of its matrix's variants) as the next golden version of
    their experiments' sides; `ConfigError` when none of them completed (nothing is recorded then)."""
    found = [(rid, t) for rid, t in _trainings(store, run_id, sides, runner_for, local_dir) if t.completed]
    if not found:
        raise ConfigError(f"run {run_id}: no completed {' or '.join(sides)} training to record as golden values")
    prepared = [(rid, t, _values(t)) for rid, t in found]  # every log parses before anything is recorded
    out = []
    for rid, t, values in prepared:
        assert t.record is not None
        assert t.sha256 is not None
        experiment = store.get_run(rid).experiment
        out.append(store.add_golden(experiment, t.side, run_id=rid, step_run_id=t.origin_step_run,
                                    log_sha256=t.sha256, values=values, note=note))
    return out


def check_goldens(store: Store, run_id: str, *, sides: Sequence[str] = SIDES,
                  runner_for: Callable[[str], StepRunner], local_dir: Path,
                  margins_for: Callable[[str], Mapping[str, Margin]]) -> GoldenCheck:
    """Each side of `run_id` (and of its matrix's variants) against its experiment's newest golden values, by
    `margins_for(run id)` (the margins of that run's recorded experiment)."""
    checks = []
    for rid in runs_of(store, run_id):
        experiment = store.get_run(rid).experiment
        wanted = []
        for side in sides:
            golden = store.golden(experiment, side) if _has_experiment(store, experiment) else None
            if golden is None:  # nothing to compare with: the log is not even fetched
                checks.append(SideCheck(experiment, side, rid, None, None, note=_no_golden(store, rid, side)))
            else:
                wanted.append((side, golden))
        if not wanted:
            continue
        runner = runner_for(rid)
        try:
            for side, golden in wanted:
                checks.append(_check_one(training_log(store, runner, rid, side, local_dir=local_dir), golden,
                                         margins_for(rid), experiment=experiment, run_id=rid))
        finally:
            runner.close()
    return GoldenCheck(run_id, tuple(checks))


def _no_golden(store: Store, run_id: str, side: str) -> str:
    """Why a side has nothing to check against, and what records it: only a completed training can be recorded
    (a capacity probe that ran out of memory never can)."""
    trained = [s for s in store.steps(run_id) if s.step == SIDE_STEP[side].name]
    if trained and trained[-1].status in (StepStatus.RAN, StepStatus.CACHED):
        return f"no golden values recorded: `alignflow golden record {run_id}`"
    if not trained:
        how = "it has no training"
    else:
        error = (trained[-1].error or "").strip().splitlines()
        how = f"its training {trained[-1].status.value}" + (f" ({error[0][:160]})" if error else "")
    return f"no golden values recorded, and none can be from run {run_id}: {how}"


def _check_one(t: TrainingLog, golden: GoldenRecord, margins: Mapping[str, Margin], *, experiment: str,
               run_id: str) -> SideCheck:
    if not t.completed:
        why = t.record.error if t.record is not None and t.record.error else "the training did not complete"
        return SideCheck(experiment, t.side, run_id, golden.version, golden.run_id, (
            OutOfMargin("training", None, None, None, why.splitlines()[0][:200], "the run"),))
    try:
        actual = _values(t)
    except AlignflowError as exc:
        return SideCheck(experiment, t.side, run_id, golden.version, golden.run_id, (
            OutOfMargin("log", None, None, None, str(exc)[:200], "the run's log"),))
    return check_side(golden.values, actual, margins, experiment=experiment, side=t.side, run_id=run_id,
                      version=golden.version, golden_run=golden.run_id)


def _has_experiment(store: Store, name: str) -> bool:
    try:
        store.get_experiment(name)
    except RecordNotFound:
        return False
    return True


def check_run_goldens(store: Store, run_id: str, *, state_dir: Path, transport_factory: TransportFactory
                      ) -> GoldenCheck | None:
    """The nightly's golden check: the run's sides (and its matrix's variants) against their golden values, by
    each recorded experiment's margins; None when none of them has goldens (the drift check then stands alone)."""
    names = set(store.golden_experiments())
    if not any(store.get_run(rid).experiment in names for rid in runs_of(store, run_id)):
        return None
    return check_goldens(
        store, run_id, runner_for=lambda rid: StepRunner(open_run(store, rid), store=store, state_dir=state_dir,
                                                         transport_factory=transport_factory),
        local_dir=state_dir / "goldens", margins_for=lambda rid: open_run(store, rid).experiment.golden.resolved())
