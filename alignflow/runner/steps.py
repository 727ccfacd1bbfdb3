"""Running one step of a run through its executor, chosen by the step's declared kind (`StepSpec.executor`),
never by its name."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from alignflow import pipeline
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.compare_step import run_compare
from alignflow.runner.diagnose_step import run_diagnose
from alignflow.runner.engine import StepRunner
from alignflow.runner.gate import run_gate
from alignflow.runner.jobstep import run_job_step
from alignflow.runner.retry import retrying
from alignflow.runner.session import StepOutcome

Executor = Callable[[StepRunner, pipeline.StepSpec, Mapping[str, ArtifactRef]], StepOutcome]
"""`(runner, step, every artifact available so far) -> outcome`; raises after recording a failure."""

EXECUTORS: dict[pipeline.ExecutorKind, Executor] = {
    "job": run_job_step,
    "gate": run_gate,
    "compare": run_compare,
    "diagnose": run_diagnose,
}


def run_step(runner: StepRunner, step: str, available: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Execute (or reuse) one step given every artifact produced so far; after a transient transport error it is
    tried again, with a notice, as `runner.backoff` says (`alignflow.runner.retry`: a step left running re-attaches
    to its job)."""
    spec = runner.ctx.pipeline.step(step)
    return retrying(lambda: EXECUTORS[spec.executor](runner, spec, available), what=step, backoff=runner.backoff,
                    notice=lambda message: runner.warn(f"{step}: {message}"), stopped=runner.cancelled)
