"""Progress people can read: the step a training has reached, of how many, its loss, rate and ETA."""

from __future__ import annotations

from alignflow.logs.render import megatron_line
from alignflow.runner.progress import ProgressTracker, StepProgress, format_duration
from tests.runner.conftest import FakeLab, twin_job
from tests.runner.hosts import DirHost, FakeJob


def _lines(upto: int, total: int = 30) -> str:
    return "".join(megatron_line(s, total, consumed_samples=4 * s, elapsed_ms=3700.0, lr=1e-3, global_batch_size=4,
                                 losses={"lm loss": 5.0 - 0.01 * s}, grad_norm=1.5) + "\n" for s in range(1, upto + 1))


def test_the_tracker_reads_the_step_its_loss_and_measures_rate_and_eta() -> None:
    now = [100.0]
    tracker = ProgressTracker("gpu_train", "cuda", total=30, log_format="megatron", clock=lambda: now[0])
    first = tracker.update("running", "partial line\n" + _lines(4))
    assert (first.iteration, first.total, first.s_per_step, first.eta_s) == (4, 30, None, None)
    now[0] += 37.0
    later = tracker.update("running", "cut\n" + _lines(14))
    assert later.iteration == 14
    assert later.metrics == {"lm_loss": 4.86, "grad_norm": 1.5}
    assert later.s_per_step == 3.7
    assert later.eta_s == 16 * 3.7
    assert later.line() == "gpu_train  step 14/30  lm_loss 4.86  grad_norm 1.5  3.7 s/step  ETA 59s"


def test_a_tail_without_step_lines_keeps_the_last_known_step() -> None:
    tracker = ProgressTracker("gpu_train", "cuda", total=30, log_format="megatron", clock=lambda: 0.0)
    tracker.update("running", "x\n" + _lines(3))
    assert tracker.update("running", "saving checkpoint...\n").iteration == 3


def test_before_the_first_step_line_the_state_and_time_are_shown() -> None:
    p = StepProgress("npu_base_train", "ascend", "waiting for a job slot", 75.0, note="waiting for one of 1 slot(s)")
    assert p.line() == "npu_base_train  waiting for a job slot for 1m15s  waiting for one of 1 slot(s)"
    assert format_duration(3 * 3600 + 125) == "3h02m"


def test_a_running_training_reports_its_step_of_the_expected_total(lab: FakeLab) -> None:
    from alignflow import pipeline
    from alignflow.runner.engine import StepRunner
    from alignflow.runner.jobstep import run_job_step
    from alignflow.runner.run import data_artifact
    from alignflow.runner.session import open_run
    from alignflow.transport import JobSpec

    def slow(spec: JobSpec) -> FakeJob:
        job = twin_job(spec)
        return FakeJob(stdout=job.stdout, outputs=job.outputs, running_polls=5)

    lab.script = slow
    ctx = open_run(lab.store, lab.start())
    seen: list[StepProgress] = []
    runner = StepRunner(ctx, store=lab.store, state_dir=lab.state, transport_factory=lab.transport,
                        controller=lab.controller, progress=seen.append, progress_every_s=0)
    run_job_step(runner, pipeline.DEFAULT.step("npu_base_train"), {"data": data_artifact(ctx, state_dir=lab.state)})
    steps = [p.iteration for p in seen]
    assert steps[0] is None  # nothing printed yet at the first poll
    assert steps[-1] is not None
    assert steps[-1] >= 3
    assert all(p.total == 4 and p.step == "npu_base_train" for p in seen)
    assert "lm_loss" in seen[-1].metrics


def test_off_a_tty_progress_is_one_line_per_step_every_so_often_and_each_step_end_one_line() -> None:
    import io

    from rich.console import Console

    from alignflow.cli.progress import ConsoleProgress

    out = io.StringIO()
    now = [0.0]
    view = ConsoleProgress(Console(file=out, width=200), plain_every_s=30, clock=lambda: now[0])
    with view:
        for t in (0, 10, 20, 31):
            now[0] = t
            view.progress(StepProgress("gpu_train", "cuda", "running", t, iteration=t // 10 + 1, total=30))
        view.message("convert_bf16: moving bf16_ckpt (1.0 MB) cpu -> ascend")  # not verbose: not shown
        view.step_ended("gpu_train", "ran", "")
        view.step_ended("convert_bf16", "cached", "from run 5622de9be3ae")
    lines = out.getvalue().splitlines()
    assert lines == ["gpu_train  cuda  step 1/30  0s", "gpu_train  cuda  step 4/30  31s", "gpu_train         ran",
                     "convert_bf16      cached  from run 5622de9be3ae"]


def test_a_job_in_a_schedulers_queue_is_shown_pending_with_its_reason(lab: FakeLab) -> None:
    """A Slurm job that waits for its allocation: the progress line says pending and Slurm's reason, and the wait
    for it does not count against the step (the real Slurm side of it: tests/transport/test_slurm.py)."""
    from alignflow import pipeline
    from alignflow.runner.engine import StepRunner
    from alignflow.runner.jobstep import run_job_step
    from alignflow.runner.run import data_artifact
    from alignflow.runner.session import open_run
    from alignflow.transport import JobHandle, JobSpec, JobState
    from alignflow.transport.jobs_direct import DirectJobs

    class Queued(DirectJobs):
        """Jobs that wait in a scheduler's queue for their first two polls (a fake of Slurm's PENDING)."""

        queued_polls = 0

        def status(self, handle: JobHandle) -> JobState:
            if self.queued_polls < 2:
                self.queued_polls += 1
                return JobState("pending", note="Slurm PENDING in partition gpu: Resources")
            return super().status(handle)

    def slow(spec: JobSpec) -> FakeJob:
        job = twin_job(spec)
        return FakeJob(stdout=job.stdout, outputs=job.outputs, running_polls=2)

    lab.script = slow
    from alignflow.config import load_hosts
    from alignflow.testing import FakeShell
    from alignflow.transport import Transport

    host = load_hosts(lab.hosts).get("ascend")
    shell = FakeShell(DirHost(host, script=lambda spec: lab.script(spec)), host)
    fake = Transport(shell, jobs=Queued, controller=lab.controller_transport, clock=lab.clock)
    ctx = open_run(lab.store, lab.start())
    seen: list[StepProgress] = []
    runner = StepRunner(ctx, store=lab.store, state_dir=lab.state,
                        transport_factory=lambda h: fake if h.name == "ascend" else lab.transport(h),
                        controller=lab.controller, progress=seen.append, progress_every_s=0)
    outcome = run_job_step(runner, pipeline.DEFAULT.step("npu_base_train"),
                           {"data": data_artifact(ctx, state_dir=lab.state)})
    assert outcome.status == "ran"
    assert [p.line() for p in seen[:2]] == [
        f"npu_base_train  pending for {format_duration(p.elapsed_s)}  Slurm PENDING in partition gpu: Resources"
        for p in seen[:2]]
    assert all(p.state != "pending" for p in seen[2:])
