"""Where a step task's messages and progress go: the task's log, a Prefect progress artifact (the bar on the task
run's page in the UI), and whoever started the run in this process (the CLI's terminal display).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol
from uuid import UUID

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from alignflow.runner.progress import StepProgress
from alignflow.runner.session import StepOutcome


class RunObserver(Protocol):
    """A listener of this process's runs (the CLI): every message and every progress report of every step."""

    def message(self, text: str) -> None: ...

    def progress(self, progress: StepProgress) -> None: ...

    def step_ended(self, step: str, status: str, detail: str) -> None: ...


_lock = threading.Lock()
_observers: list[RunObserver] = []


@contextmanager
def observing(observer: RunObserver) -> Iterator[None]:
    """Send the messages and progress of the runs executed in this process to `observer` while inside."""
    with _lock:
        _observers.append(observer)
    try:
        yield
    finally:
        with _lock:
            _observers.remove(observer)


def _each() -> list[RunObserver]:
    with _lock:
        return list(_observers)


class TaskReporter:
    """A step task's events: each goes to the task's run logger and to the process's observers; progress also
    to one Prefect progress artifact per step task (percent of the training's steps)."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter[logging.Logger], step: str) -> None:
        self.logger, self.step = logger, step
        self._artifact: UUID | None = None

    def message(self, text: str) -> None:
        self.logger.info("%s", text)
        for observer in _each():
            observer.message(text)

    def ended(self, outcome: StepOutcome) -> None:
        # ids labelled with what they are (issue 40): `alignflow show` takes either
        detail = f"step run {outcome.step_run_id}" if outcome.step_run_id else ""
        if outcome.reused_from_run:
            detail = f"from run {outcome.reused_from_run}"
        if outcome.verdict:
            detail = f"verdict {outcome.verdict}" + (f", {detail}" if detail else "")
        self._ended(outcome.status.value, detail)

    def failed(self, exc: BaseException) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        self._ended("failed" if isinstance(exc, Exception) else "cancelled", first)

    def _ended(self, status: str, detail: str) -> None:
        self.logger.info("%s: %s%s", self.step, status, f" ({detail})" if detail else "")
        for observer in _each():
            observer.step_ended(self.step, status, detail)

    def progress(self, p: StepProgress) -> None:
        self.logger.info("%s", p.line())
        for observer in _each():
            observer.progress(p)
        if p.iteration is None or not p.total:
            return
        percent = min(100.0, 100.0 * p.iteration / p.total)
        if self._artifact is None:
            made = create_progress_artifact(percent, description=f"{self.step}: training steps done")
            assert isinstance(made, UUID)  # the sync API in a sync task (its async twin returns a coroutine)
            self._artifact = made
        else:
            update_progress_artifact(self._artifact, percent, description=p.line())
