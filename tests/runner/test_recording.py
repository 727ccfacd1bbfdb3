"""The step recording policy when the run was cancelled from outside the step (`cancel_run_jobs`)."""

from __future__ import annotations

import logging

import pytest

from alignflow.config import load_hosts
from alignflow.errors import RemoteJobError
from alignflow.runner.control import cancel_run_jobs
from alignflow.runner.recording import recording
from alignflow.store.records import RunStatus, StepStatus
from alignflow.transport import JobSpec
from tests.runner.conftest import FakeLab


def test_a_step_whose_run_was_cancelled_meanwhile_keeps_its_cancelled_record_without_an_error_logged(
        lab: FakeLab, caplog: pytest.LogCaptureFixture) -> None:
    # A flow run stopped by SIGTERM kills its jobs and records the run cancelled (flows.hooks.stop_running_jobs);
    # the step's own thread then sees its job end, killed, and fails: the store keeps the cancelled record.
    run_id = lab.start()
    caplog.set_level(logging.INFO, logger="alignflow.runner.recording")
    transport = lab.transport(load_hosts(lab.hosts).get("ascend"))

    def step_seeing_its_job_killed() -> str:
        with recording(lab.store, run_id, "npu_base_train", host="ascend", command="train", cache_key="k",
                       inputs={}) as rec:
            rec.attach([transport.launch(JobSpec(["train"], name="npu_base_train"))], resumable=False)
            cancel_run_jobs(lab.store, run_id, transport_factory=lab.transport, why="the flow run was stopped (X)")
            raise RemoteJobError("ascend: step npu_base_train cancelled; job dir /fake/ascend/jobs/j")

    with pytest.raises(RemoteJobError):
        step_seeing_its_job_killed()
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
    assert cancel_run_jobs(lab.store, run_id, transport_factory=lab.transport, why="the flow run was stopped (X)") == []
    assert cancel_run_jobs(lab.store, run_id, transport_factory=lab.transport) == []
    run = lab.store.get_run(run_id)
    assert (run.status, run.error) == (RunStatus.CANCELLED, "cancelled")
