"""`Canceller`: a cancellation asked (a signal) runs in its own thread; closing one never asked returns at once."""

from __future__ import annotations

import time

from alignflow.runner.control import Canceller


def test_closing_a_canceller_never_asked_returns_at_once_and_cancels_nothing() -> None:
    asked: list[str] = []

    def cancel(why: str) -> list[str]:
        asked.append(why)
        return []

    canceller = Canceller("r1", cancel)
    started = time.monotonic()
    canceller.close()
    assert time.monotonic() - started < 0.1  # closed by every run: no poll interval to wait out
    assert asked == []
    canceller.request("too late")  # after close: nothing happens
    assert asked == []


def test_a_requested_cancellation_runs_once_and_close_waits_for_it() -> None:
    asked: list[str] = []

    def cancel(why: str) -> list[str]:
        time.sleep(0.05)
        asked.append(why)
        return ["job-1"]

    canceller = Canceller("r1", cancel)
    canceller.request("stopped (SIGTERM)")
    canceller.request("again")  # once
    canceller.close()
    assert asked == ["stopped (SIGTERM)"]
    assert canceller.killed == ["job-1"]
