"""Retrying a step after a transient transport error, with a notice the user sees and a back-off that yields.

Only what can succeed is retried (`AlignflowError.retryable`: a dropped connection, a timeout, a host that did not
answer); what retrying cannot change (a name that does not resolve, a host key, a refused key, a workdir that
cannot be made: `HostUnusable`) ends the step at once. Each retry is announced before its back-off,
`retrying (2/3) in 30 s: <cause>`, through the run's events (the terminal, the task's log): the retries of
Prefect's engine were silent, so a run retrying a dead host for ten minutes looked hung (issue 45).

The back-off sleeps in short slices and looks at `stopped` between them: a cancellation (Ctrl-C in the
controller, whose main thread is not the one sleeping here; `alignflow cancel`) ends it within a slice, where
Prefect's `time.sleep` in a task's thread held a Ctrl-C for up to five minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from alignflow.errors import AlignflowError, RunCancelled

T = TypeVar("T")

RETRY_DELAYS_S = (10.0, 30.0, 90.0)
SLICE_S = 0.2  # how soon a back-off sees a cancellation


@dataclass(frozen=True, slots=True)
class Backoff:
    """How a step is retried: the delay before each retry (their number is the number of retries) and how one
    slice of a delay is slept (a test passes a clock that does not really sleep)."""

    delays_s: tuple[float, ...] = RETRY_DELAYS_S
    sleep: Callable[[float], None] = time.sleep
    slice_s: float = SLICE_S

    def wait(self, seconds: float, *, stopped: Callable[[], bool], what: str) -> None:
        """Sleep `seconds` in slices; `RunCancelled` as soon as `stopped()` says so."""
        left = seconds
        while True:
            if stopped():
                raise RunCancelled(f"{what}: cancelled during the back-off before its retry")
            if left <= 0:
                return
            step = min(self.slice_s, left)
            self.sleep(step)
            left -= step


def retrying(attempt: Callable[[], T], *, what: str, backoff: Backoff, notice: Callable[[str], None],
             stopped: Callable[[], bool]) -> T:
    """`attempt()`, called again after each retryable `AlignflowError` while retries are left, each announced
    through `notice` (`retrying (n/N) in D s: <the error's first line>`); the last error, or any other, is raised."""
    retries = len(backoff.delays_s)
    for n, delay in enumerate((*backoff.delays_s, None), start=1):
        try:
            return attempt()
        except AlignflowError as exc:
            if not exc.retryable or delay is None:
                raise
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            notice(f"retrying ({n}/{retries}) in {delay:g} s: {cause}")
            backoff.wait(delay, stopped=stopped, what=what)
    raise AssertionError("unreachable: the last attempt returns or raises")
