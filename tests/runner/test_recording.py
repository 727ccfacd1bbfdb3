"""The step recording policy when the run was cancelled from outside the step (`cancel_run_jobs`)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from alignflow.config import load_hosts
from alignflow.errors import RemoteJobError
from alignflow.runner.control import cancel_interrupted, cancel_run_jobs
from alignflow.runner.recording import recording
from alignflow.store.records import RunStatus, StepRunRecord, StepStatus
from alignflow.testing import Command
from alignflow.transport import JobHandle, JobSpec, JobState
from tests.deploy.team import wait_until
from tests.runner.conftest import FakeLab, twin_job
from tests.runner.hosts import FakeJob


def _step_whose_job_the_run_cancel_killed(lab: FakeLab, run_id: str) -> list[str]:
    """A step that launched its job, saw the run cancelled from outside (its job killed) and failed on it; returns
    what that cancellation killed."""
    transport = lab.transport(load_hosts(lab.hosts).get("ascend"))
    killed: list[str] = []

    def step() -> None:
        with recording(lab.store, run_id, "npu_base_train", host="ascend", command="train", cache_key="k",
                       inputs={}) as rec:
            rec.attach([transport.launch(JobSpec(["train"], name="npu_base_train"))])
            killed.extend(cancel_run_jobs(lab.store, run_id, transport_factory=lab.transport,
                                          why="the flow run was stopped (X)"))
            raise RemoteJobError("ascend: step npu_base_train cancelled; job dir /fake/ascend/jobs/j")

    with pytest.raises(RemoteJobError):
        step()
    return killed


def test_a_step_whose_run_was_cancelled_meanwhile_keeps_its_cancelled_record_without_an_error_logged(
        lab: FakeLab, caplog: pytest.LogCaptureFixture) -> None:
    # A flow run stopped by SIGTERM kills its jobs and records the run cancelled (control.cancel_interrupted);
    # the step's own thread then sees its job end, killed, and fails: the store keeps the cancelled record.
    run_id = lab.start()
    caplog.set_level(logging.INFO, logger="alignflow.runner.recording")
    assert len(_step_whose_job_the_run_cancel_killed(lab, run_id)) == 1
    [step] = [s for s in lab.store.steps(run_id) if s.step == "npu_base_train"]
    assert step.status == StepStatus.CANCELLED
    assert step.error == "cancelled: the flow run was stopped (X); its job was killed"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "recorded cancelled already" in caplog.text


def test_cancelling_a_run_that_its_controller_already_cancelled_kills_nothing_and_keeps_its_record(
        lab: FakeLab) -> None:
    # `alignflow cancel` SIGTERMs a run's controller, which cancels the run as it stops; the command's own
    # cancellation that follows, and a flow's cancellation hooks, find nothing left to do
    run_id = lab.start()
    assert len(_step_whose_job_the_run_cancel_killed(lab, run_id)) == 1
    assert cancel_run_jobs(lab.store, run_id, transport_factory=lab.transport, why="the flow run was stopped (X)") == []
    assert cancel_run_jobs(lab.store, run_id, transport_factory=lab.transport) == []
    run = lab.store.get_run(run_id)
    assert (run.status, run.error) == (RunStatus.CANCELLED, "cancelled: the flow run was stopped (X)")
    [step] = [s for s in lab.store.steps(run_id) if s.step == "npu_base_train"]
    assert step.error == "cancelled: the flow run was stopped (X); its job was killed"


def test_a_failure_to_cancel_an_interrupted_run_is_logged_not_raised_over_the_interruption(
        lab: FakeLab, caplog: pytest.LogCaptureFixture) -> None:
    # the controller is stopping (Ctrl-C, SIGTERM): what it re-raises must stay the interruption, not a store error
    cancel_interrupted(lab.store, "no-such-run", KeyboardInterrupt(), transport_factory=lab.transport)
    assert "run no-such-run: killing its jobs as the run stopped failed" in caplog.text


def test_a_step_that_sees_its_job_killed_before_the_run_cancel_records_it_is_cancelled_and_the_cancel_goes_on(
        lab: FakeLab, caplog: pytest.LogCaptureFixture) -> None:
    # The other order of the race above (seen in the team test): the cancel marks the job and kills it; the step's
    # own thread polls, sees the job `cancelled` and records its step before the cancel does. The step must say
    # cancelled (not failed), and the cancel must go on to record the run cancelled, not stop on the closed step.
    lab.script = lambda spec: FakeJob(running_polls=10**6) if spec.name.endswith("npu_base_train") else twin_job(spec)
    run_id = lab.start()
    ascend = lab.transport(load_hosts(lab.hosts).get("ascend"))

    def slow_status(command: Command) -> None:
        if command.name == "status":
            time.sleep(0.005)  # a job that trains until someone cancels it, polled as the runner polls

    def step_record() -> StepRunRecord | None:
        return next((s for s in lab.store.steps(run_id) if s.step == "npu_base_train"), None)

    killed_by_cancel = ascend.cancel

    def cancel_then_let_the_step_record_first(handle: JobHandle, *, grace_s: float = 10.0) -> JobState:
        state = killed_by_cancel(handle, grace_s=grace_s)
        wait_until("the step to record its cancelled job", lambda: (rec := step_record()) is not None
                   and rec.status != StepStatus.RUNNING, timeout_s=30, every_s=0.005)
        return state

    lab.hosts_of["ascend"].before = slow_status
    ascend.cancel = cancel_then_let_the_step_record_first  # type: ignore[method-assign]
    walk = ThreadPoolExecutor(1).submit(lab.execute, run_id)
    wait_until("the step's job", lambda: (rec := step_record()) is not None and rec.job_handle is not None,
               timeout_s=30, every_s=0.005)
    caplog.set_level(logging.INFO)
    assert len(cancel_run_jobs(lab.store, run_id, transport_factory=lab.transport, why="stopped (X)")) == 1
    view = walk.result(timeout=30)  # its walker, too, closes the run cancelled, without a verdict
    assert (view.status, view.verdict) == (RunStatus.CANCELLED, None)
    step = step_record()
    assert step is not None
    assert step.status == StepStatus.CANCELLED, step
    assert (step.error or "").startswith("cancelled: ascend: step npu_base_train cancelled"), step.error
    assert lab.store.get_run(run_id).status == RunStatus.CANCELLED
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
