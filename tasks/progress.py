"""Where a step task's messages and progress go: the task's log, a Prefect progress artifact (the bar on the task
run's page in the UI), and whoever started the run in this process (the CLI's terminal display).

The terminal gets every observation (the runner reports a running job every few seconds); the task's log and the
progress artifact, which are writes to the Prefect API, at most one every `LOG_EVERY_S`. When the step ends, its
artifact says how: 100 % for a step that ran, where it stopped for one that failed or was cancelled (a finished run
must not keep a bar stuck at "step 29/30").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol
from uuid import UUID

from prefect.artifacts import create_progress_artifact, update_progress_artifact

from alignflow.runner.progress import StepProgress
from alignflow.runner.session import StepOutcome

LOG_EVERY_S = 10.0


class RunObserver(Protocol):
    """A listener of this process's runs (the CLI): every message and every progress report of every step."""

    def message(self, text: str) -> None: ...

    def progress(self, progress: StepProgress) -> None: ...

    def step_ended(self, step: str, status: str, detail: str) -> None: ...

    def run_link(self, name: str, link: str | None) -> None: ...


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


def announce_flow_run(name: str, link: str | None) -> None:
    """Tell the observers which flow run executes their run, and where the UI shows it."""
    for observer in _each():
        observer.run_link(name, link)


class TaskReporter:
    """A step task's events: each goes to the process's observers, and to the task's run logger; progress also to
    one Prefect progress artifact per step task (percent of the training's steps)."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter[logging.Logger], step: str, *,
                 log_every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.step = logger, step
        self.log_every_s, self._clock = log_every_s, clock
        self._artifact: UUID | None = None
        self._last: StepProgress | None = None
        self._logged_at: float | None = None

    def warning(self, text: str) -> None:
        """A message every verbosity shows (Prefect's console handler shows warnings, `--quiet` too) and the UI."""
        self.logger.warning("%s", text)

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

    def failed(self, exc: BaseException, *, cancelled: bool = False) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        self._ended("cancelled" if cancelled or not isinstance(exc, Exception) else "failed", first)

    def _ended(self, status: str, detail: str) -> None:
        self.logger.info("%s: %s%s", self.step, status, f" ({detail})" if detail else "")
        self._close_artifact(status)
        for observer in _each():
            observer.step_ended(self.step, status, detail)

    def progress(self, p: StepProgress) -> None:
        if p.step != self.step:  # the runner's step name; the reporter's label tells a matrix's variants apart
            p = dataclasses.replace(p, step=self.step)
        for observer in _each():
            observer.progress(p)
        self._last = p
        now = self._clock()
        due = self._logged_at is None or now - self._logged_at >= self.log_every_s
        if due:
            self._logged_at = now
            self.logger.info("%s", p.line())
        if p.iteration is None or not p.total:
            return
        if self._artifact is None:
            made = create_progress_artifact(_percent(p), description=f"{self.step}: training steps done")
            assert isinstance(made, UUID)  # the sync API in a sync task (its async twin returns a coroutine)
            self._artifact = made
        elif due:
            update_progress_artifact(self._artifact, _percent(p), description=p.line())

    def _close_artifact(self, status: str) -> None:
        """The bar's last word: done, or where the training stopped."""
        if self._artifact is None or self._last is None:
            return
        p = self._last
        if status in ("ran", "cached"):
            update_progress_artifact(self._artifact, 100.0,
                                     description=f"{self.step}: {status}, {p.total} of {p.total} training steps")
        else:
            update_progress_artifact(self._artifact, _percent(p),
                                     description=f"{self.step}: {status} at step {p.iteration} of {p.total}")


def _percent(p: StepProgress) -> float:
    return min(100.0, 100.0 * (p.iteration or 0) / p.total) if p.total else 0.0
