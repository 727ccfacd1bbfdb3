"""The `job` executor: one command on the step's host as a detached job (trainings and conversions).

Render the command, compute the cache key (inputs' sha256, never outputs'), reuse a valid cached result, else
stage the inputs, launch, wait, check the training log (sentinels, required lines, every step present) and
fingerprint the outputs on their host.
"""

from __future__ import annotations

import hashlib
import shlex
import uuid
from collections.abc import Mapping

from alignflow import pipeline
from alignflow.backends.commands import StepCommand, retry_on, step_command, timeout_for
from alignflow.backends.launch import failed_rank
from alignflow.backends.template import CommandTemplate
from alignflow.config.hosts import Host
from alignflow.errors import (
    AlignflowError,
    CommandTimeout,
    PathMissing,
    PipelineError,
    RemoteJobError,
    RunCancelled,
    SentinelError,
)
from alignflow.runner.artifacts import ArtifactRef, declared_inputs
from alignflow.runner.cache import cache_key, one_at_a_time
from alignflow.runner.engine import StepRunner
from alignflow.runner.placeholders import fill_all
from alignflow.runner.recording import StepRecord, recorded_jobs, recording
from alignflow.runner.session import StepOutcome
from alignflow.store.records import StepStatus
from alignflow.transport import JobHandle, JobState, Transport
from alignflow.transport.jobs import error_line

STDERR_LINES = 15


def run_job_step(runner: StepRunner, spec: pipeline.StepSpec, available: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Run (or reuse) one job step. Raises on failure after recording it."""
    inputs = declared_inputs(spec, available)
    host = runner.host(spec.name)
    transport = runner.transport(host)
    if not runner.is_probing:  # a probe records nothing (the step takes it when it runs; its key may need it below)
        runner.snapshot(host)
    command = step_command(runner.experiment, spec.name, data_sha256=inputs["data"].sha256 if "data" in inputs
                           else "", host=host)
    template = command.template
    key = cache_key(step=spec.name, argv=template.argv, files=template.files, env=template.env,
                    code_version=runner.code_version(template, host),
                    inputs={n: ref.sha256 for n, ref in inputs.items()})
    # the same training asked for twice at once (a matrix's runs, two runs of one experiment) executes once
    waiting = f"{spec.name} ({key[:12]})"
    with one_at_a_time(key, lock_dir=runner.state_dir / "locks" / "steps", what=waiting, run_id=runner.run_id,
                       events=runner.emit, check=lambda: runner.check_cancelled(f"{spec.name} waited for {waiting}")):
        return _run_or_reuse(runner, spec, host, transport, command, inputs, key)


def _run_or_reuse(runner: StepRunner, spec: pipeline.StepSpec, host: Host, transport: Transport,
                  command: StepCommand, inputs: Mapping[str, ArtifactRef], key: str) -> StepOutcome:
    template = command.template
    reused = runner.reused(spec.name, key)
    if reused is not None:
        return reused
    resume = runner.resumable(spec.name, key)
    if resume is not None:
        # An earlier attempt of this task launched the job and lost its connection: re-attach, never relaunch.
        jobs = recorded_jobs(resume)
        assert jobs is not None  # what made the step run resumable: one job, its output dir
        assert jobs.out is not None
        handle, out = jobs.handles[0], jobs.out
        runner.emit(f"{spec.name}: re-attaching to job {handle.job_dir} launched by an earlier attempt")
        with recording(runner.store, runner.run_id, spec.name, host=host.name, command=resume.command or "",
                       cache_key=key, inputs=inputs, resume=resume) as rec:
            return _finish_job(runner, spec, host, transport, command, rec, handle, out)
    staged = {n: runner.stage(ref, host) for n, ref in inputs.items()}
    out = runner.out_dir(transport, spec.name, f"{key[:12]}-{uuid.uuid4().hex[:8]}")
    values = {"python": transport.python(), "out": out, **{f"in:{n}": p for n, p in staged.items()}}
    argv = fill_all(template.argv, values)
    with recording(runner.store, runner.run_id, spec.name, host=host.name, command=shlex.join(argv),
                   cache_key=key, inputs={**inputs, **code_file_refs(template, host.name, out)}) as rec:
        handle = runner.launch(transport, template, values, argv, out=out, name=f"{runner.run_id}-{spec.name}",
                               time_limit_s=timeout_for(runner.experiment, spec.name))
        runner.attach(rec, [(transport, handle)], out=out)  # a run cancelled as it launched: killed here
        runner.emit(f"{spec.name}: launched on {host.name} (job {handle.job_dir})")
        return _finish_job(runner, spec, host, transport, command, rec, handle, out)


def code_file_refs(template: CommandTemplate, host: str, out: str) -> dict[str, ArtifactRef]:
    """The template's code files (declared Megatron fixes) as recorded inputs: name, where the step writes them, and
    the sha256 of their text."""
    refs = {}
    for name, rel in template.code_files.items():
        data = template.files[rel].encode()
        refs[name] = ArtifactRef(name=name, host=host, path=f"{out}/{rel}", sha256=hashlib.sha256(data).hexdigest(),
                                 size=len(data), kind="file")
    return refs


def _finish_job(runner: StepRunner, spec: pipeline.StepSpec, host: Host, transport: Transport,
                command: StepCommand, rec: StepRecord, handle: JobHandle, out: str) -> StepOutcome:
    """Wait for the job; on success check its log and fingerprint its outputs (the record learns as it goes)."""
    timeout_s = timeout_for(runner.experiment, spec.name)
    try:
        state = runner.wait(spec.name, transport, handle, timeout_s, total=command.expect_steps,
                            log_format=command.template.log_format if spec.log_source else None, step_run=rec.id)
    except CommandTimeout:
        _cancel_quietly(transport, handle)
        rec.stdout_tail, rec.stderr_tail = runner.tails(transport, handle)
        raise PipelineError(f"{host.name}: step {spec.name} still running after {timeout_s:.0f} s (its time limit; "
                            f"steps.{spec.name}.timeout_s raises it); the job was killed, job dir {handle.job_dir}"
                            ) from None
    except RunCancelled as exc:  # the run was cancelled after its canceller looked for this job: `wait` killed it
        rec.stdout_tail, rec.stderr_tail = runner.tails(transport, handle)
        rec.end(StepStatus.CANCELLED, f"cancelled: {exc}")
        raise
    except AlignflowError as exc:
        if not exc.retryable:
            rec.stdout_tail, rec.stderr_tail = runner.tails(transport, handle)
        raise
    except BaseException as exc:
        if not isinstance(exc, Exception):  # interrupted: a cancelled step must not leave its job training
            _cancel_quietly(transport, handle)
        raise
    rec.exit_code = state.exit_code
    rec.stdout_tail, rec.stderr_tail = runner.tails(transport, handle, check=True)
    if not state.ok:
        error = RemoteJobError(_job_failed(host, spec.name, state, handle, rec.stderr_tail, rec.stdout_tail),
                               handle=handle, state=state)
        if state.kind in retry_on(runner.experiment, spec.name):
            # the scheduler ended it (preempted, time limit) and the step asks to be run again: this step run is
            # over (recorded failed), the task's retry launches a new job
            rec.end(StepStatus.FAILED, f"{error}; retried (steps.{spec.name}.retry_on)")
            error.retryable = True
        elif state.kind == "cancelled":
            # killed by a cancellation from outside this step (the run's cancel, `alignflow cancel`, scancel): the
            # step was cancelled, not failed, whether this thread or the canceller records it first
            rec.end(StepStatus.CANCELLED, f"cancelled: {error}")
        raise error
    outputs = command.outputs(spec)
    if spec.log_source is not None:
        if command.template.log == "stdout":
            transport.run(["cp", f"{handle.job_dir}/stdout", f"{out}/train.log"])
        _check_log(runner, spec, transport, f"{out}/{outputs[_log_artifact(spec)]}", command, rec.id)
    refs = _fingerprint_outputs(spec, host, transport, out, outputs)
    for ref in refs.values():
        rec.add(ref)
    rec.ran(exit_code=state.exit_code, stdout_tail=rec.stdout_tail, stderr_tail=rec.stderr_tail)
    runner.emit(f"{spec.name}: ran on {host.name}")
    return StepOutcome(spec.name, StepStatus.RAN, refs, rec.id, rec.record.cache_key)


def _job_failed(host: Host, step: str, state: JobState, handle: JobHandle, stderr_tail: str,
                stdout_tail: str = "") -> str:
    lines = stderr_tail.rstrip().splitlines()[-STDERR_LINES:]
    why = error_line(stderr_tail, stdout_tail)  # the job's own error line (issue 16): MindFormers logs on stdout
    dead = failed_rank(stderr_tail)  # a many-rank training: which rank died (torchrun's root cause)
    why = f"{dead}; {why}" if dead and why else dead or why
    return (f"{host.name}: step {step} {state}{f': {why}' if why else ''}; job dir {handle.job_dir}\n"
            + "\n".join("    " + x for x in lines))


def _cancel_quietly(transport: Transport, handle: JobHandle) -> None:
    try:
        transport.cancel(handle)
    except Exception:  # best effort while an interruption propagates; the run's cancel hook tries again
        return


def _log_artifact(spec: pipeline.StepSpec) -> str:
    """The step's training-log output (the one declared at `train.log`)."""
    return next(o.artifact for o in spec.outputs if o.path == "train.log")


def _check_log(runner: StepRunner, spec: pipeline.StepSpec, transport: Transport, path: str, command: StepCommand,
               step_run_id: str) -> None:
    """Parse the training log on the controller: sentinels, required lines, every step present; record metrics."""
    parsed = runner.read_log(spec.name, transport, path, command.template, spec.name)
    if command.expect_steps is not None:
        got = sorted(int(s) for s in parsed.frame.index)
        want = list(range(1, command.expect_steps + 1))
        if got != want:
            missing = sorted(set(want) - set(got))
            raise SentinelError(
                f"{spec.name}: the log holds steps {got[:3]}...{got[-3:] if got else []} ({len(got)}), expected "
                f"1..{command.expect_steps}; missing {missing[:10]}", sentinels=[])
    assert spec.log_source is not None
    runner.store.add_metrics(runner.run_id, source=spec.log_source, frame=parsed.frame, step_run_id=step_run_id)


def _fingerprint_outputs(spec: pipeline.StepSpec, host: Host, transport: Transport, out: str,
                         outputs: Mapping[str, str]) -> dict[str, ArtifactRef]:
    paths = {name: f"{out}/{rel}" for name, rel in outputs.items()}
    try:
        fps = transport.sha256(list(paths.values()))
    except PathMissing:
        # the batch stops at the first missing path: name every declared output that is missing
        missing = [f"{name} ({p})" for name, p in paths.items() if not transport.exists(p)]
        raise PipelineError(f"{host.name}: step {spec.name} exited 0 but did not produce declared output(s) "
                            f"{', '.join(missing)}") from None
    return {name: ArtifactRef.from_fingerprint(name, host.name, p, fps[p], pipeline.ARTIFACTS[name].kind)
            for name, p in paths.items()}
