"""A step task's progress in the Prefect UI: a bar per training that ends where the step did (issue 40: a finished
run kept a progress artifact stuck at "step 29/30")."""

from __future__ import annotations

import io
import logging
from typing import Any
from uuid import UUID, uuid4

import pytest

import tasks.progress
from alignflow.runner.progress import StepProgress
from alignflow.runner.session import StepOutcome
from alignflow.store.records import StepStatus
from tasks.progress import TaskReporter


class Artifacts:
    """Prefect's progress-artifact calls, recorded (the real ones need a task run on a server)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bars: dict[UUID, list[tuple[float, str]]] = {}
        monkeypatch.setattr(tasks.progress, "create_progress_artifact", self.create)
        monkeypatch.setattr(tasks.progress, "update_progress_artifact", self.update)

    def create(self, progress: float, description: str) -> UUID:
        made = uuid4()
        self.bars[made] = [(progress, description)]
        return made

    def update(self, artifact_id: UUID, progress: float, description: str) -> Any:
        self.bars[artifact_id].append((progress, description))


def _at(step: int) -> StepProgress:
    return StepProgress("gpu_train", "cuda", "running", 3.0 * step, iteration=step, total=30,
                        metrics={"lm_loss": 5.0}, s_per_step=3.0, eta_s=3.0 * (30 - step))


def _reporter(now: list[float]) -> TaskReporter:
    return TaskReporter(logging.getLogger("tests.task_progress"), "gpu_train", log_every_s=10, clock=lambda: now[0])


def test_a_step_that_ran_ends_its_bar_at_100_percent_whatever_the_last_observation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    artifacts = Artifacts(monkeypatch)
    now = [0.0]
    reporter = _reporter(now)
    for step in range(1, 30):  # an observation every 2 s; the API is written at most every 10 s
        reporter.progress(_at(step))
        now[0] += 2.0
    reporter.ended(StepOutcome("gpu_train", StepStatus.RAN, {}, "0123456789ab", "k"))
    (bar,) = artifacts.bars.values()
    assert len(bar) <= 1 + 58 // 10 + 1  # created, throttled updates, closed
    assert bar[-1] == (100.0, "gpu_train: ran, 30 of 30 training steps")


def test_a_cancelled_step_leaves_its_bar_where_the_training_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    artifacts = Artifacts(monkeypatch)
    now = [0.0]
    reporter = _reporter(now)
    reporter.progress(_at(4))
    now[0] += 2.0
    reporter.progress(_at(12))
    reporter.failed(KeyboardInterrupt())
    (bar,) = artifacts.bars.values()
    assert bar[-1] == (40.0, "gpu_train: cancelled at step 12 of 30")


def test_a_matrix_trainings_rows_are_labelled_with_its_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two variants' gpu_train run side by side: the terminal keeps a row for each, named by its variant (the
    runner reports the bare step name)."""
    from rich.console import Console

    from alignflow.cli.progress import ConsoleProgress
    from tasks.progress import observing

    Artifacts(monkeypatch)
    display = ConsoleProgress(Console(file=io.StringIO(), width=100))
    log = logging.getLogger("tests.task_progress")
    with observing(display):
        for variant in ("01_recompute", "06_capacity"):
            TaskReporter(log, f"{variant}/gpu_train").progress(_at(3))
    assert set(display.rows) == {"01_recompute/gpu_train", "06_capacity/gpu_train"}


def test_a_retry_notice_is_a_warning_which_every_verbosity_shows(caplog: pytest.LogCaptureFixture) -> None:
    """Off --verbose the terminal shows Prefect's WARNING records and not the task's info lines (flows/console.py):
    a retry's notice is a warning, so a run retrying a host does not look hung (issue 45)."""
    logger = logging.getLogger("test.task")
    with caplog.at_level(logging.INFO, logger="test.task"):
        TaskReporter(logger, "gpu_train").warning("gpu_train: retrying (1/3) in 10 s: cuda: connection lost")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "gpu_train: retrying (1/3) in 10 s: cuda: connection lost")]
