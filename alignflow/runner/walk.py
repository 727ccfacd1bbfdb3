"""The one walker of the pipeline's DAG, used by the Prefect flow and by `execute_pipeline`.

`walk` starts every step of the plan as soon as the steps it reads from are done (`Plan.ready`), through a
`Scheduler` that decides *how* a step runs: a thread here, a Prefect task in `flows.alignment`. So the
concurrency of a run is the DAG's, whoever schedules it: `npu_reload_train` starts beside `convert_megatron`.

When a step fails, no new step starts; the steps already running are waited for (a multi-hour training that
does not depend on the failure keeps its result, recorded and reusable by a re-run), then the walk reports every
failure. Cancelling the run (the flow's cancellation, Ctrl-C) is what stops running jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from alignflow import pipeline
from alignflow.errors import AlignflowError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.session import StepOutcome


class StepFuture(Protocol):
    """A step that was submitted: `result()` waits for it and returns its outcome or raises its error."""

    def result(self) -> StepOutcome: ...


F = TypeVar("F", bound=StepFuture)


class Scheduler(Protocol[F]):
    """How the walker runs steps: submit one, and tell which of several submitted ones finishes first."""

    def submit(self, step: str, available: Mapping[str, ArtifactRef]) -> F: ...

    def first_done(self, futures: Iterable[F]) -> F: ...


@dataclass(frozen=True, slots=True)
class StepFailure:
    step: str
    error: str
    exception: BaseException = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class WalkResult:
    """Every step that ended, in the order they ended; `failures` empty when the whole plan succeeded."""

    outcomes: dict[str, StepOutcome]
    failures: tuple[StepFailure, ...]

    @property
    def error(self) -> str | None:
        """One message for the run's record: every failed step's error."""
        if not self.failures:
            return None
        if len(self.failures) == 1:
            return self.failures[0].error
        return "\n".join(f"{f.step}: {f.error}" for f in self.failures)


def walk(plan: pipeline.Plan, available: Mapping[str, ArtifactRef], scheduler: Scheduler[F]) -> WalkResult:
    """Run the plan's steps in DAG order, each as soon as its upstream steps are done."""
    artifacts = dict(available)
    outcomes: dict[str, StepOutcome] = {}
    failures: list[StepFailure] = []
    running: dict[F, str] = {}
    while True:
        if not failures:
            for name in plan.ready(done=outcomes, started=set(running.values())):
                running[scheduler.submit(name, dict(artifacts))] = name
        if not running:
            break
        future = scheduler.first_done(running)
        name = running.pop(future)
        try:
            outcome = future.result()
        except AlignflowError as exc:
            failures.append(StepFailure(name, str(exc), exc))
            continue
        except Exception as exc:  # a bug in a step: recorded by its executor; the run reports it
            failures.append(StepFailure(name, f"{type(exc).__name__}: {exc}", exc))
            continue
        outcomes[name] = outcome
        artifacts.update(outcome.artifacts)
    return WalkResult(outcomes, tuple(failures))


class ThreadScheduler:
    """Runs each step in a thread of a pool (the plain-Python walk); `workers=1` runs them one at a time."""

    def __init__(self, run: Callable[[str, Mapping[str, ArtifactRef]], StepOutcome], *, workers: int = 4) -> None:
        self._run = run
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="alignflow-step")

    def submit(self, step: str, available: Mapping[str, ArtifactRef]) -> Future[StepOutcome]:
        return self._pool.submit(self._run, step, available)

    def first_done(self, futures: Iterable[Future[StepOutcome]]) -> Future[StepOutcome]:
        done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
        return next(iter(done))

    def close(self) -> None:
        self._pool.shutdown(wait=True)

