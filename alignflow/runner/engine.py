"""Executing one pipeline step: stage inputs, render, check the cache, launch, poll, verify, record.

Every step follows the same path, whatever backend or host it uses:

1. resolve the host and open its transport; take the host snapshot once per run;
2. render the command template and compute the cache key (inputs' sha256, never outputs');
3. a completed step run with the same key whose outputs still hash the same *on their host* is reused (`cached`);
4. otherwise move the inputs to the host (sha256 verified on arrival), write config files, launch a detached
   job, record its handle before polling, poll until it ends;
5. fetch the log, check the framework's sentinels and the step count (a run that exited 0 can still be invalid),
   fingerprint the outputs on their host, record artifacts and metrics.

Only transport errors are retryable (they surface as `TransportError`); a failed command, a sentinel or a
fingerprint mismatch ends the step as `failed` with the reason recorded.
"""

from __future__ import annotations

import logging
import shlex
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from alignflow import pipeline
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host, Inventory
from alignflow.errors import AlignflowError, PathMissing, PipelineError, RemoteJobError, SentinelError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.cache import cache_key, repo_version
from alignflow.runner.commands import StepCommand, step_command, timeout_for
from alignflow.runner.placeholders import fill, fill_all
from alignflow.runner.session import CONTROLLER, Events, StepOutcome, resolve_host

log = logging.getLogger(__name__)

POLL_S = 2.0
TAIL_BYTES = 8192


class StepRunner:
    """Runs steps of one run; holds its transports and snapshots. Not thread-safe: one per task."""

    def __init__(
        self,
        *,
        run_id: str,
        experiment: Experiment,
        inventory: Inventory,
        store: Any,
        state_dir: Path,
        forced: frozenset[str],
        transport_factory: Any,
        events: Events | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.run_id = run_id
        self.experiment = experiment
        self.inventory = inventory
        self.store = store
        self.state_dir = state_dir
        self.forced = forced
        self._factory = transport_factory
        self._transports: dict[str, Any] = {}
        self._events = events or (lambda msg: log.info("%s", msg))
        self.poll_s = poll_s

    # ------------------------------------------------------------------ plumbing
    def emit(self, message: str) -> None:
        self._events(message)

    def host(self, step: str) -> Host:
        return resolve_host(self.experiment, self.inventory, step, self.state_dir)

    def transport(self, host: Host) -> Any:
        t = self._transports.get(host.name)
        if t is None:
            if host.name == CONTROLLER and host.role == "controller":
                # The controller's own files (data, reports) are the user's: no workdir confinement there.
                from alignflow.transport import controller_transport

                t = controller_transport(memo_path=str(self.state_dir / "hashmemo.sqlite"))
            else:
                t = self._factory(host)
            self._transports[host.name] = t
        return t

    def transport_by_name(self, name: str) -> Any:
        if name == CONTROLLER:
            return self.transport(resolve_host(self.experiment, self.inventory, "compare", self.state_dir))
        return self.transport(self.inventory.get(name))

    def close(self) -> None:
        for t in self._transports.values():
            try:
                t.close()
            except Exception:  # closing is best effort; the run's outcome is already recorded
                log.debug("closing transport failed", exc_info=True)
        self._transports.clear()

    def snapshot(self, host: Host) -> dict[str, Any]:
        """The host's snapshot, taken once per run and recorded."""
        existing = {s.host: s.data for s in self.store.snapshots(self.run_id)}
        if host.name in existing:
            return dict(existing[host.name])
        data = self.transport(host).snapshot().to_dict()
        self.store.add_snapshot(self.run_id, host.name, data)
        return dict(data)

    def verify(self, refs: Iterable[ArtifactRef]) -> list[str]:
        """What no longer holds of `refs` on their hosts (empty: every one still hashes as recorded).

        One `sha256` call per host for all of that host's artifacts; a vanished path is a problem, not an error.
        Transport errors propagate (the caller decides whether an unverifiable artifact is fatal).
        """
        by_host: dict[str, list[ArtifactRef]] = defaultdict(list)
        for ref in refs:
            by_host[ref.host].append(ref)
        problems: list[str] = []
        for host, group in by_host.items():
            try:
                now = self.transport_by_name(host).sha256([ref.path for ref in group])
            except PathMissing as exc:
                problems.append(f"{exc.path} vanished from {host} ({', '.join(r.name for r in group)} not verified)")
                continue
            problems += [f"{ref.name} at {ref.host}:{ref.path} changed (sha256 {now[ref.path].sha256[:12]} != "
                         f"{ref.sha256[:12]})" for ref in group if now[ref.path].sha256 != ref.sha256]
        return problems

    def code_version(self, template: Any, host: Host) -> str:
        """A command's code version: the framework checkout's commit on `host` when the template names one."""
        if template.code_repo:
            return f"{template.code_repo}@{repo_version(self.snapshot(host), template.code_repo)}"
        return str(template.code_version)

    def launch(self, transport: Any, template: Any, values: Mapping[str, str], argv: list[str], *, out: str,
               name: str) -> Any:
        """Create `out`, write the template's config files there, launch the detached job; its handle.

        The job holds one of the host's max_concurrent_jobs slots (on the host: shared by every controller) while
        it runs, waiting there for one if all are taken.
        """
        from alignflow.transport import JobSpec

        transport.mkdir(out)
        for rel, text in template.files.items():
            transport.write_text(f"{out}/{rel}", fill(text, values))
        env = {k: fill(v, values) for k, v in template.env.items()}
        return transport.launch(JobSpec(argv=argv, name=name, env=env, cwd=out, take_slot=True))

    def read_log(self, label: str, transport: Any, path: str, template: Any, local_name: str) -> Any:
        """Fetch a training log to `runs/<id>/logs/<local_name>.log`, parse it, check its sentinels and the lines
        a valid log contains; the parsed log."""
        from alignflow.logs import check_sentinels, parse_log

        local = self.state_dir / "runs" / self.run_id / "logs" / f"{local_name}.log"
        local.parent.mkdir(parents=True, exist_ok=True)
        transport.get(path, str(local), overwrite=True)
        text = local.read_text(encoding="utf-8", errors="replace")
        parsed = parse_log(text.splitlines(), fmt=template.log_format, source=f"{label}:{path}")
        check_sentinels(parsed)
        for required in template.required_lines:
            if required not in text:
                raise SentinelError(f"{label}: the log never says {required!r} ({path}); the run is not valid (the "
                                    "weights were not loaded as expected?)", sentinels=[])
        return parsed

    # ------------------------------------------------------------------ staging
    def stage(self, artifact: ArtifactRef, host: Host) -> str:
        """Path of `artifact` on `host`; copied there (and verified) when it lives elsewhere."""
        if artifact.host == host.name:
            return artifact.path
        on_host = self.experiment.data.host_paths.get(host.role) if artifact.name == "data" else None
        if on_host is not None:
            return self._verify_on_host(artifact, host, on_host)
        from alignflow.transport import copy_between

        dst_t = self.transport(host)
        dest = dst_t.path(f"inputs/{artifact.name}-{artifact.sha256[:16]}")
        if dst_t.exists(dest):
            have = dst_t.sha256([dest])[dest]
            if have.sha256 == artifact.sha256:
                return str(dest)
            dst_t.remove(dest)
        self.emit(f"moving {artifact.name} ({artifact.size / 1e6:.1f} MB) {artifact.host} -> {host.name}")
        src_t = self.transport_by_name(artifact.host)
        fp = copy_between(src_t, artifact.path, dst_t, dest)
        if fp.sha256 != artifact.sha256:
            from alignflow.errors import FingerprintMismatch

            raise FingerprintMismatch(
                f"{host.name}:{dest}: {artifact.name} arrived with sha256 {fp.sha256}, expected {artifact.sha256}",
                expected=artifact.sha256, actual=fp.sha256)
        return str(dest)

    def _verify_on_host(self, artifact: ArtifactRef, host: Host, path: str) -> str:
        """Data that already lives on the host (declared in `data.host_paths`): same sha256, or refuse."""
        from alignflow.errors import FingerprintMismatch

        t = self.transport(host)
        have = t.sha256([path])[path].sha256
        if have != artifact.sha256:
            raise FingerprintMismatch(
                f"{host.name}:{path}: data sha256 {have} differs from {artifact.sha256} ({artifact.host}:"
                f"{artifact.path}); both sides must read the same bytes", expected=artifact.sha256, actual=have)
        return path

    # ------------------------------------------------------------------ the step
    def execute(self, step: str, inputs: Mapping[str, ArtifactRef]) -> StepOutcome:
        """Run (or reuse) one command step. Raises on failure after recording it."""
        sdef = pipeline.step(step)
        missing = [n for n in sdef.inputs if n not in inputs]
        if missing:
            raise PipelineError(f"step {step}: missing input artifact(s) {', '.join(missing)}")
        host = self.host(step)
        transport = self.transport(host)
        self.snapshot(host)
        data_sha = inputs["data"].sha256 if "data" in inputs else ""
        command = step_command(self.experiment, step, data_sha256=data_sha)
        template = command.template
        key = cache_key(step=step, argv=template.argv, files=template.files, env=template.env,
                        code_version=self.code_version(template, host),
                        inputs={n: inputs[n].sha256 for n in sdef.inputs})
        if step not in self.forced:
            reused = self._reuse(step, key)
            if reused is not None:
                return reused
        return self._run(step, key, host, transport, command, inputs)

    def _reuse(self, step: str, key: str, cached: Any = None) -> StepOutcome | None:
        """Reuse the step run `cached` (by default the store's newest successful one with `key`) when every
        artifact of it still hashes the same on its host."""
        cached = cached if cached is not None else self.store.find_cached_step(step, key)
        if cached is None:
            return None
        refs = {a.name: ArtifactRef.from_record(a) for a in self.store.artifacts(cached.id)}
        try:
            problems = self.verify(refs.values())
        except AlignflowError as exc:
            self.emit(f"{step}: cannot verify the cached outputs ({exc}); re-running")
            return None
        if problems:
            self.emit(f"{step}: cached " + "; ".join(problems) + "; re-running")
            return None
        record = self.store.record_cached_step(self.run_id, step, host=cached.host, command=cached.command,
                                               cache_key=key, reused_from=cached.id, inputs=cached.inputs)
        self.emit(f"{step}: cached (reusing step run {cached.id} of run {cached.run_id})")
        return StepOutcome(step, "cached", refs, record.id, key)

    def _run(self, step: str, key: str, host: Host, transport: Any, command: StepCommand,
             inputs: Mapping[str, ArtifactRef]) -> StepOutcome:
        template = command.template
        sdef = pipeline.step(step)
        from alignflow.transport import JobHandle

        state: Any = None
        handle: Any = None
        tails: tuple[str, str] | None = None
        resumed = self._resumable(step, key)
        if resumed is not None:
            # An earlier attempt of this task launched the job and lost its connection: re-attach, never relaunch.
            step_run, recorded = resumed
            handle, out = JobHandle.from_dict(recorded), str(recorded["out"])
            self.emit(f"{step}: re-attaching to job {handle.job_dir} launched by an earlier attempt")
        else:
            local_inputs = {n: self.stage(inputs[n], host) for n in sdef.inputs}
            out = str(transport.path(f"artifacts/{step}/{key[:12]}-{uuid.uuid4().hex[:8]}"))
            values = {"python": transport.python(), "out": out, **{f"in:{n}": p for n, p in local_inputs.items()}}
            argv = fill_all(template.argv, values)
            step_run = self.store.start_step(self.run_id, step, host=host.name, command=shlex.join(argv),
                                             cache_key=key, inputs={n: inputs[n].to_dict() for n in sdef.inputs})
        try:
            if handle is None:
                handle = self.launch(transport, template, values, argv, out=out, name=f"{self.run_id}-{step}")
                self.store.attach_job(step_run.id, job_dir=handle.job_dir, handle={**handle.to_dict(), "out": out})
                self.emit(f"{step}: launched on {host.name} (job {handle.job_dir})")
            state = self._wait(step, transport, handle, timeout_for(self.experiment, step))
            tails = stdout_tail, stderr_tail = self._tails(transport, handle, check=True)
            if not state.ok:
                raise RemoteJobError(
                    f"{host.name}: step {step} {state}; job dir {handle.job_dir}\n"
                    + "\n".join("    " + line for line in stderr_tail.rstrip().splitlines()[-15:]),
                    handle=handle, state=state)
            outputs = dict(command.outputs)
            if template.log_format and command.log_source is not None:
                log_rel = "train.log" if template.log == "stdout" else template.log
                if template.log == "stdout":
                    transport.run(["cp", f"{handle.job_dir}/stdout", f"{out}/train.log"])
                outputs = {k: (log_rel if v == "train.log" else v) for k, v in outputs.items()}
                self._check_log(step, transport, f"{out}/{log_rel}", command, step_run.id)
            refs = self._fingerprint_outputs(step, host, transport, out, outputs)
            for ref in refs.values():
                self.store.add_artifact(step_run.id, name=ref.name, host=ref.host, path=ref.path, kind=ref.kind,
                                        sha256=ref.sha256, size_bytes=ref.size, manifest=ref.manifest)
            self.store.finish_step(step_run.id, status="ran", exit_code=state.exit_code, stdout_tail=stdout_tail,
                                   stderr_tail=stderr_tail)
            self.emit(f"{step}: ran on {host.name}")
            return StepOutcome(step, "ran", refs, step_run.id, key)
        except AlignflowError as exc:
            if getattr(exc, "retryable", False):
                # A transport failure: the job may still be running; the step run stays open so that the retry
                # of this task re-attaches to it (`_resumable`).
                raise
            # The job's own exit code even when the step failed for another reason (a sentinel in a log of a
            # process that exited 0 is exactly the case people must be able to see).
            code = state.exit_code if state is not None else None
            tails = tails or self._tails(transport, handle)  # already fetched when the job had ended
            self.store.finish_step(step_run.id, status="failed", exit_code=code, stdout_tail=tails[0],
                                   stderr_tail=tails[1], error=str(exc))
            raise

    def _resumable(self, step: str, key: str) -> tuple[Any, dict[str, Any]] | None:
        """This run's open step run of `step` with the same key and a recorded job, if an attempt left one."""
        for sr in reversed(self.store.steps(self.run_id)):
            if sr.step == step and sr.status == "running" and sr.cache_key == key and sr.job_handle \
                    and "out" in sr.job_handle:
                return sr, dict(sr.job_handle)
        return None

    @staticmethod
    def _tails(transport: Any, handle: Any, *, check: bool = False) -> tuple[str, str]:
        """The job's stdout and stderr tails; with `check`, a transport error propagates (else: empty tails)."""
        if handle is None:
            return "", ""
        try:
            return (transport.tail(handle, TAIL_BYTES, stream="stdout"),
                    transport.tail(handle, TAIL_BYTES, stream="stderr"))
        except AlignflowError:
            if check:
                raise
            return "", ""

    def _wait(self, step: str, transport: Any, handle: Any, timeout_s: float) -> Any:
        started = time.monotonic()
        last = [0.0]

        def on_poll(state: Any) -> None:
            now = time.monotonic()
            if now - last[0] >= 10.0:
                last[0] = now
                try:
                    tail = transport.tail(handle, 600).rstrip().splitlines()
                except AlignflowError:
                    tail = []
                if not tail:  # nothing printed yet: perhaps still waiting for a job slot on the host
                    note = transport.slot_note(handle)
                    tail = [note] if note.startswith("waiting") else []
                line = f" | {tail[-1].strip()[-160:]}" if tail else ""
                self.emit(f"{step}: {state} after {now - started:.0f}s{line}")

        return transport.wait(handle, poll_s=self.poll_s, timeout_s=timeout_s, on_poll=on_poll)

    def _check_log(self, step: str, transport: Any, path: str, command: StepCommand, step_run_id: str) -> None:
        """Parse the training log on the controller: sentinels, required lines, every step present."""
        parsed = self.read_log(step, transport, path, command.template, step)
        if command.expect_steps is not None:
            got = sorted(int(s) for s in parsed.frame.index)
            want = list(range(1, command.expect_steps + 1))
            if got != want:
                missing = sorted(set(want) - set(got))
                raise SentinelError(
                    f"{step}: the log holds steps {got[:3]}...{got[-3:] if got else []} ({len(got)}), expected "
                    f"1..{command.expect_steps}; missing {missing[:10]}", sentinels=[])
        self.store.add_metrics(self.run_id, source=command.log_source, frame=parsed.frame, step_run_id=step_run_id)

    def _fingerprint_outputs(self, step: str, host: Host, transport: Any, out: str,
                             outputs: Mapping[str, str]) -> dict[str, ArtifactRef]:
        paths = {name: f"{out}/{rel}" for name, rel in outputs.items()}
        try:
            fps = transport.sha256(list(paths.values()))
        except PathMissing:
            # the batch stops at the first missing path: name every declared output that is missing
            missing = [f"{name} ({p})" for name, p in paths.items() if not transport.exists(p)]
            raise PipelineError(f"{host.name}: step {step} exited 0 but did not produce declared output(s) "
                                f"{', '.join(missing)}") from None
        refs = {}
        for name, p in paths.items():
            fp = fps[p]
            kind = pipeline.ARTIFACTS[name].kind
            manifest = [[f.path, f.sha256, f.size] for f in fp.files] if fp.kind == "dir" else None
            refs[name] = ArtifactRef(name, host.name, p, fp.sha256, fp.size, kind, manifest)
        return refs
