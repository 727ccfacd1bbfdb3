"""Retrying only what can succeed (issue 45, item 2): a transient transport error is retried with a notice the user
sees, a permanent one ends the step at once (run `error`, exit 2), a cancellation ends a back-off at once."""

from __future__ import annotations

import threading
import time

import pytest

from alignflow.errors import HostNotFound, HostUnreachable, RunCancelled
from alignflow.runner.engine import StepRunner
from alignflow.runner.retry import Backoff, retrying
from alignflow.runner.run import execute_pipeline
from alignflow.runner.session import open_run
from alignflow.runner.steps import run_step
from alignflow.store.records import RunStatus
from alignflow.testing import Command
from tests.runner.conftest import FakeLab
from tests.runner.hosts import VirtualClock


def _fail_first(lab: FakeLab, run_id: str, host: str, error: Exception, times: int = 1) -> list[Command]:
    """`host`'s first `times` launches raise `error` (the transport's own reconnects having given up)."""
    lab.transport(open_run(lab.store, run_id).inventory.get(host))
    seen: list[Command] = []

    def before(command: Command) -> None:
        if command.name == "launch" and len(seen) < times:
            seen.append(command)
            raise error

    lab.hosts_of[host].before = before
    return seen


def _execute(lab: FakeLab, run_id: str, backoff: Backoff) -> object:
    return execute_pipeline(run_id, store=lab.store, state_dir=lab.state, transport_factory=lab.transport,
                            controller=lab.controller, events=lab.messages.append, backoff=backoff)


def test_a_dropped_connection_is_retried_with_a_visible_notice(lab: FakeLab) -> None:
    run_id = lab.start()
    clock = VirtualClock()
    _fail_first(lab, run_id, "ascend", HostUnreachable("connection lost during a command: EOF", host="ascend"))
    view = _execute(lab, run_id, Backoff(delays_s=(10, 30, 90), sleep=clock.sleep))
    assert view.status == "completed"  # type: ignore[attr-defined]
    assert "npu_base_train: retrying (1/3) in 10 s: ascend: connection lost during a command: EOF" in lab.messages
    assert clock.now == pytest.approx(10)  # one back-off, slept in slices
    assert len(lab.hosts_of["ascend"].launched) >= 1


def test_a_host_whose_name_does_not_resolve_ends_the_run_error_at_once_not_retried(lab: FakeLab) -> None:
    run_id = lab.start()
    clock = VirtualClock()
    _fail_first(lab, run_id, "ascend", HostNotFound("cannot resolve 'npu.invalid'", host="ascend"), times=9)
    view = _execute(lab, run_id, Backoff(delays_s=(10, 30, 90), sleep=clock.sleep))
    assert view.status == "error"  # type: ignore[attr-defined]
    assert view.exit_code == 2  # type: ignore[attr-defined]
    assert view.error.startswith("ascend: cannot resolve 'npu.invalid'")  # type: ignore[attr-defined]
    assert "(check: ascend reachable)" in view.error  # type: ignore[attr-defined]
    assert clock.now == 0
    assert not [m for m in lab.messages if "retrying" in m]
    # the step that failed is recorded failed, with its error (it failed before its executor recorded it)
    step = view.step("npu_base_train")  # type: ignore[attr-defined]
    assert (step.status, step.error.startswith("ascend: cannot resolve")) == ("failed", True)


def test_the_last_retry_s_error_ends_the_step() -> None:
    clock = VirtualClock()
    notices: list[str] = []
    calls = []

    def attempt() -> None:
        calls.append(1)
        raise HostUnreachable("no answer from h:22 within 10 s", host="h")

    with pytest.raises(HostUnreachable):
        retrying(attempt, what="gpu_train", backoff=Backoff(delays_s=(1, 2), sleep=clock.sleep),
                 notice=notices.append, stopped=lambda: False)
    assert len(calls) == 3
    assert notices == ["retrying (1/2) in 1 s: h: no answer from h:22 within 10 s",
                       "retrying (2/2) in 2 s: h: no answer from h:22 within 10 s"]


def test_a_cancellation_during_the_back_off_ends_it_at_once(lab: FakeLab) -> None:
    """Ctrl-C lands in the controller, whose canceller records the run cancelled; a step thread in its back-off sees
    it within a look (`CANCEL_LOOK_S`), not after the delay (Prefect's retry slept through it: minutes)."""
    run_id = lab.start()
    _fail_first(lab, run_id, "ascend", HostUnreachable("connection lost", host="ascend"), times=9)
    runner = StepRunner(open_run(lab.store, run_id), store=lab.store, state_dir=lab.state,
                        transport_factory=lab.transport, controller=lab.controller, events=lab.messages.append,
                        warnings=lab.messages.append, backoff=Backoff(delays_s=(600,), slice_s=0.05))
    from alignflow.runner.run import data_artifact

    data = data_artifact(runner.ctx, state_dir=lab.state)
    timer = threading.Timer(0.3, lambda: lab.store.finish_run(run_id, status=RunStatus.CANCELLED, verdict=None,
                                                                 report=None, error="cancelled: Ctrl-C"))
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(RunCancelled, match="npu_base_train: cancelled during the back-off"):
            run_step(runner, "npu_base_train", {"data": data})
    finally:
        timer.cancel()
        runner.close()
    assert time.monotonic() - started < 5
    assert "npu_base_train: retrying (1/1) in 600 s: ascend: connection lost" in lab.messages


def test_a_step_submitted_after_the_cancellation_starts_nothing_on_its_host(lab: FakeLab) -> None:
    """The walk had the step queued when the run was cancelled: it looks once, unthrottled (`cancelled` had just
    answered False within its CANCEL_LOOK_S), and its host is not asked anything."""
    run_id = lab.start()
    runner = StepRunner(open_run(lab.store, run_id), store=lab.store, state_dir=lab.state,
                        transport_factory=lab.transport, controller=lab.controller, events=lab.messages.append)
    from alignflow.runner.run import data_artifact

    data = data_artifact(runner.ctx, state_dir=lab.state)
    try:
        assert not runner.cancelled()  # the throttled look: the next within CANCEL_LOOK_S answers False unasked
        lab.store.finish_run(run_id, status=RunStatus.CANCELLED, verdict=None, report=None, error="cancelled: Ctrl-C")
        with pytest.raises(RunCancelled, match=f"npu_base_train: not started: run {run_id} was cancelled"):
            run_step(runner, "npu_base_train", {"data": data})
    finally:
        runner.close()
    assert "ascend" not in lab.hosts_of or lab.hosts_of["ascend"].commands == []
