"""The runner's logic on fake hosts: what runs, what is recorded, what is reused, and how a step ends."""

from __future__ import annotations

import pytest

from alignflow.errors import HostUnreachable
from alignflow.runview import RunView
from alignflow.store.records import StepStatus
from alignflow.testing import Command
from alignflow.transport import JobSpec
from tests.runner.conftest import FakeLab, gpu_log, twin_job
from tests.runner.hosts import DirHost, FakeJob, dir_transport

EVERY_STEP = ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare")


def statuses(view: RunView) -> dict[str, str]:
    return {s.step: s.status for s in view.steps}


def test_a_run_executes_every_step_on_its_host_and_records_each_output(lab: FakeLab) -> None:
    record = lab.run()
    assert record.status == "completed", record.error
    assert record.verdict == "pass"
    assert statuses(record) == dict.fromkeys(EVERY_STEP, "ran")
    assert lab.launched("ascend") == ["npu_base_train", "npu_reload_train"]
    assert lab.launched("cpu") == ["convert_bf16", "convert_megatron"]
    assert lab.launched("cuda") == ["gpu_train"]
    for step in record.steps:
        for art in step.artifacts:
            if art.host in lab.fakes:  # the recorded sha256 is the output's fingerprint on its host
                assert lab.fakes[art.host].sha256([art.path])[art.path].sha256 == art.sha256
    # the trainings' logs were checked and their metrics recorded by source
    assert set(lab.store.metrics(record.run_id)["source"]) == {"npu_base", "npu", "gpu"}


def test_a_second_run_reuses_every_step_and_launches_nothing(lab: FakeLab) -> None:
    first = lab.run()
    launched = {h: len(f.launched) for h, f in lab.hosts_of.items()}
    second = lab.run()
    assert statuses(second) == dict.fromkeys(EVERY_STEP, "cached")
    assert second.verdict == "pass"
    assert {h: len(f.launched) for h, f in lab.hosts_of.items()} == launched
    reused = {s.step: s.reused_from for s in lab.store.steps(second.run_id)}
    assert reused == {s.step: s.id for s in lab.store.steps(first.run_id)}


def test_a_cached_output_that_changed_on_its_host_is_executed_again(lab: FakeLab) -> None:
    first = lab.run()
    bf16 = next(a for s in first.steps for a in s.artifacts if a.name == "bf16_ckpt")
    lab.fakes["cpu"].write_text(bf16.path + "/model.safetensors", "tampered")
    second = lab.run()
    assert statuses(second)["convert_bf16"] == "ran"
    assert any("convert_bf16: cached" in m and "changed" in m for m in lab.messages)


def test_a_failed_job_fails_its_step_with_exit_code_and_stderr_and_skips_what_depends_on_it(lab: FakeLab) -> None:
    def broken_megatron(spec: JobSpec) -> FakeJob:
        if "convert megatron" in " ".join(spec.argv):
            return FakeJob(exit_code=1, stderr="ConversionError: missing target key 'decoder.final_layernorm'\n")
        return twin_job(spec)

    lab.script = broken_megatron
    record = lab.run()
    assert record.status == "failed"
    assert statuses(record) == {"npu_base_train": "ran", "convert_bf16": "ran", "convert_megatron": "failed",
                                "gpu_train": "skipped", "npu_reload_train": "ran", "compare": "skipped"}
    failed = next(s for s in lab.store.steps(record.run_id) if s.step == "convert_megatron")
    assert failed.exit_code == 1
    assert "missing target key 'decoder.final_layernorm'" in (failed.stderr_tail or "")
    assert "exited(1)" in (failed.error or "")
    assert "missing target key" in (failed.error or "")
    assert "exited(1)" in (record.error or "")


def test_a_sentinel_in_a_log_of_a_job_that_exited_0_fails_the_step(lab: FakeLab) -> None:
    def nonstrict(spec: JobSpec) -> FakeJob:
        if "torch_train" in " ".join(spec.argv):
            return FakeJob(stdout=" load_return: _IncompatibleKeys(missing_keys=['w'], unexpected_keys=[])\n"
                           + gpu_log(8))
        return twin_job(spec)

    lab.script = nonstrict
    record = lab.run()
    assert statuses(record)["gpu_train"] == "failed"
    failed = next(s for s in lab.store.steps(record.run_id) if s.step == "gpu_train")
    assert failed.exit_code == 0
    assert "load_return" in (failed.error or "")


def test_a_log_missing_steps_fails_the_step(lab: FakeLab) -> None:
    def short(spec: JobSpec) -> FakeJob:
        if "torch_train" in " ".join(spec.argv):
            return FakeJob(stdout=gpu_log(5))
        return twin_job(spec)

    lab.script = short
    record = lab.run()
    failed = next(s for s in lab.store.steps(record.run_id) if s.step == "gpu_train")
    assert failed.status == StepStatus.FAILED
    assert "expected 1..8; missing [6, 7, 8]" in (failed.error or "")


def test_a_job_that_produced_no_declared_output_fails_naming_it(lab: FakeLab) -> None:
    def lost(spec: JobSpec) -> FakeJob:
        if "convert bf16" in " ".join(spec.argv):
            return FakeJob()
        return twin_job(spec)

    lab.script = lost
    record = lab.run()
    failed = next(s for s in lab.store.steps(record.run_id) if s.step == "convert_bf16")
    assert "did not produce declared output(s) bf16_ckpt" in (failed.error or "")


def test_a_step_past_its_time_limit_is_killed_and_fails_saying_which_limit(lab: FakeLab) -> None:
    def hangs(spec: JobSpec) -> FakeJob:
        if "convert bf16" in " ".join(spec.argv):
            return FakeJob(running_polls=None)
        return twin_job(spec)

    lab.script = hangs
    lab.edit(steps__convert_bf16__timeout_s=60)
    record = lab.run()
    failed = next(s for s in lab.store.steps(record.run_id) if s.step == "convert_bf16")
    assert failed.status == StepStatus.FAILED
    assert "still running after 60 s" in (failed.error or "")
    assert "steps.convert_bf16.timeout_s" in (failed.error or "")
    assert len(lab.hosts_of["cpu"].cancelled) == 1  # the job was killed, not left running


def test_a_retry_after_a_lost_connection_reattaches_to_the_job_instead_of_launching_again(lab: FakeLab) -> None:
    from alignflow import pipeline
    from alignflow.runner.engine import StepRunner
    from alignflow.runner.jobstep import run_job_step
    from alignflow.runner.run import data_artifact
    from alignflow.runner.session import open_run

    run_id = lab.start()
    ctx = open_run(lab.store, run_id)
    host = ctx.inventory.get("ascend")
    ascend = DirHost(host, script=twin_job)
    dropped: list[Command] = []

    def lost_for_good_once(command: Command) -> None:
        # the job has ended; reading its output is where the host is lost for good (the transport's own
        # reconnects gave up), so the step's task fails with a retryable error
        if command.name == "tail" and not dropped:
            dropped.append(command)
            raise HostUnreachable("connection lost while reading the job's output", host=host.name)

    ascend.before = lost_for_good_once
    host_t = dir_transport(host, ascend, controller=lab.controller_transport, clock=lab.clock)
    runner = StepRunner(ctx, store=lab.store, state_dir=lab.state, transport_factory=lambda h: host_t,
                        controller=lab.controller)
    spec = pipeline.DEFAULT.step("npu_base_train")
    data = data_artifact(ctx, state_dir=lab.state)
    with pytest.raises(HostUnreachable):
        run_job_step(runner, spec, {"data": data})
    open_step = [s for s in lab.store.steps(run_id) if s.step == "npu_base_train"]
    assert [s.status for s in open_step] == [StepStatus.RUNNING]  # left open for the retry
    outcome = run_job_step(runner, spec, {"data": data})  # what run_step's retry does (runner.retry)
    assert outcome.status == StepStatus.RAN
    assert len(ascend.launched) == 1
    assert [s.status for s in lab.store.steps(run_id) if s.step == "npu_base_train"] == [StepStatus.RAN]


def test_an_interrupted_run_cancels_its_running_jobs_and_records_them_cancelled(lab: FakeLab) -> None:
    def interrupted(command: Command) -> None:
        if command.name == "status":
            raise KeyboardInterrupt

    run_id = lab.start()
    handlers: dict[str, DirHost] = {}

    def factory(host: object) -> object:
        from alignflow.config.hosts import Host

        assert isinstance(host, Host)
        handler = handlers.setdefault(host.name, DirHost(host, script=twin_job))
        handler.before = interrupted
        return dir_transport(host, handler, controller=lab.controller_transport, clock=lab.clock)

    from alignflow.runner.run import execute_pipeline

    with pytest.raises(KeyboardInterrupt):
        execute_pipeline(run_id, store=lab.store, state_dir=lab.state, transport_factory=factory,  # type: ignore[arg-type]
                         controller=lab.controller)
    assert handlers["ascend"].cancelled  # the job was killed
    steps = {s.step: s for s in lab.store.steps(run_id)}
    assert steps["npu_base_train"].status == StepStatus.CANCELLED
    assert lab.store.get_run(run_id).status == "cancelled"
