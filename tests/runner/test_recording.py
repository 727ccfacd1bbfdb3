"""The step recording policy when the run was cancelled from outside the step (`cancel_run_jobs`)."""

from __future__ import annotations

import logging

import pytest

from alignflow.config import load_hosts
from alignflow.errors import RemoteJobError
from alignflow.runner.control import cancel_interrupted, cancel_run_jobs
from alignflow.runner.recording import recording
from alignflow.store.records import RunStatus, StepStatus
from alignflow.transport import JobSpec
from tests.runner.conftest import FakeLab


def _step_whose_job_the_run_cancel_killed(lab: FakeLab, run_id: str) -> list[str]:
    """A step that launched its job, saw the run cancelled from outside (its job killed) and failed on it; returns
    what that cancellation killed."""
    transport = lab.transport(load_hosts(lab.hosts).get("ascend"))
    killed: list[str] = []

    def step() -> None:
        with recording(lab.store, run_id, "npu_base_train", host="ascend", command="train", cache_key="k",
                       inputs={}) as rec:
            rec.attach([transport.launch(JobSpec(["train"], name="npu_base_train"))], resumable=False)
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
    assert step.error == "cancelled: the flow run was stopped (X); its remote job was killed"
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
    assert (run.status, run.error) == (RunStatus.CANCELLED, "cancelled")
    [step] = [s for s in lab.store.steps(run_id) if s.step == "npu_base_train"]
    assert step.error == "cancelled: the flow run was stopped (X); its remote job was killed"


def test_a_failure_to_cancel_an_interrupted_run_is_logged_not_raised_over_the_interruption(
        lab: FakeLab, caplog: pytest.LogCaptureFixture) -> None:
    # the controller is stopping (Ctrl-C, SIGTERM): what it re-raises must stay the interruption, not a store error
    cancel_interrupted(lab.store, "no-such-run", KeyboardInterrupt(), transport_factory=lab.transport)
    assert "run no-such-run: killing its jobs as the run stopped failed" in caplog.text
