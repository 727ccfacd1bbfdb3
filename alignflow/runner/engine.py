"""`StepRunner`: what every executor of one run needs — hosts, transports, snapshots, staging of inputs, job
launch and wait, log reading, output verification and the cache.

The executors themselves (`jobstep`, `gate`, `compare_step`) decide what a step does; this class is the one
place that knows how a step reaches a host:

1. resolve the host and open its transport; take the host snapshot once per run;
2. a completed step run with the same cache key whose outputs still hash the same *on their host* is reused;
3. inputs move to the host through a verified copy (sha256 on arrival), config files are written, a detached
   job is launched and its handle recorded before polling;
4. a training log is fetched and checked (sentinels, required lines) on the controller.

Only transport errors are retryable (they surface as `TransportError`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from alignflow.backends.template import CommandTemplate
from alignflow.codeversion import repo_version
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host, Inventory
from alignflow.config.placement import CONTROLLER
from alignflow.errors import (
    AlignflowError,
    FingerprintMismatch,
    ImmutableRecord,
    PathMissing,
    PipelineError,
    RunCancelled,
    SentinelError,
)
from alignflow.logs.schema import ParsedLog
from alignflow.logs.sentinels import CHECKPOINT_LOADED, check_sentinels
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.placeholders import fill
from alignflow.runner.progress import ProgressFn, ProgressTracker
from alignflow.runner.recording import StepRecord, recorded_jobs
from alignflow.runner.retry import Backoff
from alignflow.runner.session import Events, RunContext, StepOutcome
from alignflow.store import Store
from alignflow.store.records import RunStatus, StepRunRecord, StepStatus
from alignflow.transport import HostSnapshot, JobHandle, JobSpec, JobState, Transport, controller_transport

if TYPE_CHECKING:
    from alignflow.logs.formats import LogFormatSpec
    from alignflow.logs.parse import FormatChoice

log = logging.getLogger(__name__)

POLL_S = 2.0
CANCEL_LOOK_S = 2.0
DEFAULT_BACKOFF = Backoff()
TAIL_BYTES = 8192
PROGRESS_EVERY_S = 10.0
PROGRESS_TAIL_BYTES = 16384  # enough for the last few step lines of any framework

TransportFactory = Callable[[Host], Transport]
Verified = tuple[str, str, str]
"""An artifact whose fingerprint was checked on its host: (host, path, sha256)."""


def verified_key(ref: ArtifactRef) -> Verified:
    return (ref.host, ref.path, ref.sha256)


class Reusable(Exception):  # not an error: how a probed step answers
    """A probed step would be reused: `outcome` is what it would take (its artifacts as recorded, not verified)."""

    def __init__(self, outcome: StepOutcome) -> None:
        super().__init__(outcome.step)
        self.outcome = outcome


class NotReusable(Exception):
    """A probed step would execute (or fail): it is left to the run's walk."""

_staging_guard = threading.Lock()
_staging: dict[tuple[str, str], threading.Lock] = {}


def _staging_lock(host: str, dest: str) -> threading.Lock:
    """One lock per staged destination in this process: two steps of a run that need the same input on the same
    host (the early gate and a training) copy it once, the second finds the first's verified copy."""
    with _staging_guard:
        return _staging.setdefault((host, dest), threading.Lock())


class StepRunner:
    """Runs steps of one run; holds its transports and snapshots. Not thread-safe: one per task."""

    def __init__(
        self,
        ctx: RunContext,
        *,
        store: Store,
        state_dir: Path,
        transport_factory: TransportFactory,
        events: Events | None = None,
        poll_s: float = POLL_S,
        controller: TransportFactory | None = None,
        progress: ProgressFn | None = None,
        progress_every_s: float = PROGRESS_EVERY_S,
        backoff: Backoff = DEFAULT_BACKOFF,
        warnings: Events | None = None,
        verified: Iterable[Verified] = (),
    ) -> None:
        """`transport_factory` opens the transport of an inventory host; `controller` the controller's own (by
        default: its real filesystem, unconfined, with the state dir's hash memo); `progress` receives where a
        running job stands every `progress_every_s` (default: a line through `events`); `backoff`: how a step is
        retried after a transient transport error (`alignflow.runner.retry`); `warnings` receives what the user must
        see at every verbosity, such as a retry's notice (default: a warning through `logging`); `verified`: the
        artifacts (`verified_key`) this run has already seen hash as recorded on their hosts (`alignflow.runner.
        cached`: a fully cached run checks every fingerprint once, host by host), not hashed again."""
        self.ctx = ctx
        self.store = store
        self.state_dir = state_dir
        self._factory = transport_factory
        self._controller = controller or (
            lambda host: controller_transport(memo_path=str(self.state_dir / "hashmemo.sqlite")))
        self._transports: dict[str, Transport] = {}
        self._events = events or (lambda msg: log.info("%s", msg))
        self._warnings = warnings or (lambda msg: log.warning("%s", msg))
        self._progress: ProgressFn = progress or (lambda p: self.emit(p.line()))
        self.progress_every_s = progress_every_s
        self.poll_s = poll_s
        self.backoff = backoff
        self._parent_steps: dict[str, StepRunRecord] | None = None
        self._cancel_looked = -CANCEL_LOOK_S
        self.verified: set[Verified] = set(verified)
        self._probing = False

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    @property
    def experiment(self) -> Experiment:
        return self.ctx.experiment

    @property
    def inventory(self) -> Inventory:
        return self.ctx.inventory

    @property
    def forced(self) -> frozenset[str]:
        return self.ctx.plan.forced

    # ------------------------------------------------------------------ plumbing
    def emit(self, message: str) -> None:
        if not self._probing:  # a probe says nothing: the step itself says it when it runs
            self._events(message)

    @contextmanager
    def probing(self) -> Iterator[None]:
        """While inside, a step's executor goes only as far as deciding whether it is reused: a reusable step
        raises `Reusable` with the outcome it would have (nothing verified on its host, nothing recorded), any other
        raises `NotReusable` before it would stage, launch or record anything (`alignflow.runner.cached`)."""
        self._probing = True
        try:
            yield
        finally:
            self._probing = False

    @property
    def is_probing(self) -> bool:
        return self._probing

    def warn(self, message: str) -> None:
        """A message the user sees whatever the verbosity (a retry's notice: a run retrying must not look hung)."""
        self._warnings(message)

    def cancelled(self, *, now: bool = False) -> bool:
        """Whether the run was cancelled: recorded cancelled by its canceller (`control.cancel_run_jobs`: Ctrl-C or
        SIGTERM here, `alignflow cancel`, the UI), which the store tells (asked at most every `CANCEL_LOOK_S`, or
        `now`: one query, for a look made once, not in a loop)."""
        looked = time.monotonic()
        if not now and looked - self._cancel_looked < CANCEL_LOOK_S:
            return False
        self._cancel_looked = looked
        try:
            return self.store.get_run(self.run_id).status == RunStatus.CANCELLED
        except AlignflowError:
            return False

    def host(self, step: str) -> Host:
        """Where `step` runs, as placed when the run started."""
        return self.ctx.placement.host(step)

    def transport(self, host: Host) -> Transport:
        t = self._transports.get(host.name)
        if t is None:
            # the controller's own files (data, reports) are the user's: no workdir confinement there
            controller = host.name == CONTROLLER and host.role == "controller"
            t = self._controller(host) if controller else self._factory(host)
            self._transports[host.name] = t
        return t

    def transport_by_name(self, name: str) -> Transport:
        if name == CONTROLLER:
            return self.transport(self.host("compare"))
        return self.transport(self.inventory.get(name))

    def close(self) -> None:
        for t in self._transports.values():
            try:
                t.close()
            except Exception:  # closing is best effort; the run's outcome is already recorded
                log.debug("closing transport failed", exc_info=True)
        self._transports.clear()

    def snapshot(self, host: Host) -> dict[str, object]:
        """The host's snapshot, taken once per run and recorded."""
        return self.snapshots([host])[host.name]

    def snapshots(self, hosts: Iterable[Host]) -> dict[str, dict[str, object]]:
        """The snapshots of `hosts` by name, each taken once per run and recorded; those not taken yet are taken
        side by side (each is a process of its own on its host: in a row, three hosts cost three start-ups). A host
        whose snapshot raises is not recorded; the first such error is raised once the others are."""
        wanted = {h.name: h for h in hosts}
        existing = {s.host: s.data for s in self.store.snapshots(self.run_id)}
        missing = [h for name, h in wanted.items() if name not in existing]
        transports = [self.transport(h) for h in missing]  # opened here, in this thread

        def take(transport: Transport) -> HostSnapshot | AlignflowError:
            try:
                return transport.snapshot()
            except AlignflowError as exc:
                return exc

        if len(transports) > 1:
            with ThreadPoolExecutor(max_workers=len(transports), thread_name_prefix="alignflow-snapshot") as pool:
                taken = list(pool.map(take, transports))
        else:
            taken = [take(t) for t in transports]
        for host, snap in zip(missing, taken, strict=True):
            if not isinstance(snap, AlignflowError):
                existing[host.name] = snap.model_dump(mode="json")
                self.store.add_snapshot(self.run_id, host.name, existing[host.name])
        error = next((snap for snap in taken if isinstance(snap, AlignflowError)), None)
        if error is not None:
            raise error
        return {name: dict(existing[name]) for name in wanted}

    def code_version(self, template: CommandTemplate, host: Host) -> str:
        """A command's code version: the framework checkout's commit on `host` when the template names one."""
        if template.code_repo:
            return f"{template.code_repo}@{repo_version(self.snapshot(host), template.code_repo)}"
        return template.code_version

    def out_dir(self, transport: Transport, step: str, name: str) -> str:
        """A fresh output directory of `step` on the transport's host (`artifacts/<step>/<name>`)."""
        return transport.path(f"artifacts/{step}/{name}")

    # ------------------------------------------------------------------ verification and the cache
    def verify(self, refs: Iterable[ArtifactRef]) -> list[str]:
        """What no longer holds of `refs` on their hosts (empty: every one still hashes as recorded).

        One `sha256` call per host for all of that host's artifacts; a vanished path is a problem, not an error.
        Transport errors propagate (the caller decides whether an unverifiable artifact is fatal).
        """
        by_host: dict[str, list[ArtifactRef]] = defaultdict(list)
        for ref in refs:
            if verified_key(ref) not in self.verified:
                by_host[ref.host].append(ref)
        problems: list[str] = []
        for host, group in by_host.items():
            try:
                now = self.transport_by_name(host).sha256([ref.path for ref in group])
            except PathMissing as exc:
                problems.append(f"{exc.path} vanished from {host} ({', '.join(r.name for r in group)} not verified)")
                continue
            changed = [ref for ref in group if now[ref.path].sha256 != ref.sha256]
            problems += [f"{ref.name} at {ref.host}:{ref.path} changed (sha256 {now[ref.path].sha256[:12]} != "
                         f"{ref.sha256[:12]})" for ref in changed]
            self.verified.update(verified_key(ref) for ref in group if ref not in changed)
        return problems

    def cached_step(self, step: str, key: str) -> StepRunRecord | None:
        """The step run that `step` with cache key `key` may reuse, if any.

        A run that reuses its parent (`rerun`) takes the parent's step run when the step would run exactly as it
        did there (same key: same command, code and inputs); a step whose key changed since — an edited
        experiment, spec or code — is not the parent's any more and is looked up like any other. A run of the
        parent's own recorded experiment (`alignflow diagnose RUN`: `recorded_from` is the parent) takes the
        parent's step run of a reuse-only step (upstream of `--only`: read, never executed) as it was recorded
        whatever its key: it diagnoses RUN's checkpoints, not the ones today's code would make, and its record
        says the experiment they were made with. Otherwise: the store's newest successful step run with that key.
        """
        parent = self._parent_step(step)
        if parent is not None:
            options = self.ctx.options
            pinned = step in self.ctx.plan.reuse_only and options.recorded_from == options.parent
            if parent.cache_key == key or pinned:
                if parent.cache_key != key:
                    self.emit(f"{step}: taken from parent run {parent.run_id} as recorded (this run only reads its "
                              "outputs; its command, code or inputs changed since)")
                return parent if parent.status == StepStatus.RAN else self.store.get_step(str(parent.reused_from))
            self.emit(f"{step}: not taken from parent run {parent.run_id}: its command, code or inputs changed since")
        return self.store.find_cached_step(step, key)

    def _parent_step(self, step: str) -> StepRunRecord | None:
        parent = self.ctx.options.parent
        if not (parent and self.ctx.options.reuse_parent):
            return None
        if self._parent_steps is None:
            self._parent_steps = {s.step: s for s in self.store.steps(parent)
                                  if s.status in (StepStatus.RAN, StepStatus.CACHED)}
        return self._parent_steps.get(step)

    def reused(self, step: str, key: str) -> StepOutcome | None:
        """What a step of this run takes from earlier work instead of executing: nothing when it is forced; a
        valid cached (or parent) result otherwise. A reuse-only step (upstream of `--only`) that has none fails
        here, before anything is launched."""
        if step in self.forced:
            if self._probing:
                raise NotReusable(step)
            return None
        outcome = self.reuse(step, key)
        if outcome is None:
            self.require_executable(step)
        return outcome

    def require_executable(self, step: str) -> None:
        """Refuse to execute a reuse-only step (one the run only reads from); while probing, any step."""
        if self._probing:
            raise NotReusable(step)
        plan = self.ctx.plan
        if step in plan.reuse_only:
            executes = ", ".join(s for s in plan.steps if s not in plan.reuse_only)
            raise PipelineError(f"step {step}: no valid earlier result to reuse (the run executes only {executes}); "
                                f"run {step} first, or leave --only out")

    def reuse(self, step: str, key: str, cached: StepRunRecord | None = None) -> StepOutcome | None:
        """Reuse `cached` (default: `cached_step(step, key)`) when every artifact of it still hashes the same on
        its host; None when there is nothing (valid) to reuse."""
        cached = cached if cached is not None else self.cached_step(step, key)
        if cached is None:
            return None
        refs = {a.name: ArtifactRef.from_record(a) for a in self.store.artifacts(cached.id)}
        if self._probing:
            raise Reusable(StepOutcome(step, StepStatus.CACHED, refs, None, cached.cache_key or key,
                                       reused_from_run=cached.run_id))
        try:
            problems = self.verify(refs.values())
        except AlignflowError as exc:
            self.emit(f"{step}: cannot verify the cached outputs ({exc}); re-running")
            return None
        if problems:
            self.emit(f"{step}: cached " + "; ".join(problems) + "; re-running")
            return None
        # the key of what is reused: the same as `key`, except for a reuse-only step pinned to its parent's record
        key = cached.cache_key or key
        record = self.store.record_cached_step(self.run_id, step, host=cached.host or "", command=cached.command or "",
                                               cache_key=key, reused_from=cached.id)
        where = "parent run" if cached.run_id == self.ctx.options.parent else "run"
        self.emit(f"{step}: cached (step run {cached.id} of {where} {cached.run_id})")
        return StepOutcome(step, StepStatus.CACHED, refs, record.id, key, reused_from_run=cached.run_id,
                           reused_from_step=cached.id)

    def resumable(self, step: str, key: str) -> StepRunRecord | None:
        """This run's open step run of `step` with the same key and one recorded job, if an attempt left one."""
        for sr in reversed(self.store.steps(self.run_id)):
            if sr.step == step and sr.status == StepStatus.RUNNING and sr.cache_key == key \
                    and (jobs := recorded_jobs(sr)) is not None and jobs.resumable:
                return sr
        return None

    # ------------------------------------------------------------------ staging
    def stage(self, artifact: ArtifactRef, host: Host) -> str:
        """Path of `artifact` on `host`; copied there (and verified) when it lives elsewhere."""
        if artifact.host == host.name:
            return artifact.path
        on_host = self.experiment.data.host_paths.get(host.role) if artifact.name == "data" else None
        if on_host is not None:
            return self._verify_on_host(artifact, host, on_host)
        dst_t = self.transport(host)
        dest = dst_t.path(f"inputs/{artifact.name}-{artifact.sha256[:16]}")
        with _staging_lock(host.name, dest):
            return self._copy_in(artifact, host, dst_t, dest)

    def _copy_in(self, artifact: ArtifactRef, host: Host, dst_t: Transport, dest: str) -> str:
        if dst_t.exists(dest):
            have = dst_t.sha256([dest])[dest]
            if have.sha256 == artifact.sha256:
                return dest
            # a staged copy that no longer hashes as it did (a flipped byte, a partial edit): replace it, or
            # every later run would find the same bad copy
            self.emit(f"{host.name}:{dest}: staged {artifact.name} changed (sha256 {have.sha256[:12]} != "
                      f"{artifact.sha256[:12]}); replacing it with a verified copy")
            dst_t.remove(dest, recursive=True)
        self.emit(f"moving {artifact.name} ({artifact.size / 1e6:.1f} MB) {artifact.host} -> {host.name}")
        src_t = self.transport_by_name(artifact.host)
        fp = dst_t.receive(src_t, artifact.path, dest)
        if fp.sha256 != artifact.sha256:
            raise FingerprintMismatch(
                f"{host.name}:{dest}: {artifact.name} arrived with sha256 {fp.sha256}, expected {artifact.sha256}",
                expected=artifact.sha256, actual=fp.sha256)
        return dest

    def _verify_on_host(self, artifact: ArtifactRef, host: Host, path: str) -> str:
        """Data that already lives on the host (declared in `data.host_paths`): same sha256, or refuse."""
        have = self.transport(host).sha256([path])[path].sha256
        if have != artifact.sha256:
            raise FingerprintMismatch(
                f"{host.name}:{path}: data sha256 {have} differs from {artifact.sha256} ({artifact.host}:"
                f"{artifact.path}); both sides must read the same bytes", expected=artifact.sha256, actual=have)
        return path

    # ------------------------------------------------------------------ jobs
    def launch(self, transport: Transport, template: CommandTemplate, values: Mapping[str, str], argv: list[str],
               *, out: str, name: str, time_limit_s: float | None = None) -> JobHandle:
        """Create `out`, write the template's config files there, launch the detached job; its handle.

        The job holds one of the host's max_concurrent_jobs slots (on the host: shared by every controller) while
        it runs, waiting there for one if all are taken; on a Slurm host it waits in Slurm's queue instead, and
        `time_limit_s` (the step's) becomes its `--time`.
        """
        transport.mkdir(out)
        for rel, text in template.files.items():
            transport.write_text(f"{out}/{rel}", fill(text, values))
        env = {k: fill(v, values) for k, v in template.env.items()}
        return transport.launch(JobSpec(argv=argv, name=name, env=env, cwd=out, take_slot=True,
                                        time_limit_s=time_limit_s))

    def check_cancelled(self, doing: str) -> None:
        """`RunCancelled` if the run was cancelled (`cancelled`): a step waiting on another run's training
        (`alignflow.runner.cache.one_at_a_time`) stops at its next look."""
        if self.cancelled():
            raise RunCancelled(f"run {self.run_id} was cancelled while {doing}")

    def attach(self, rec: StepRecord, jobs: Sequence[tuple[Transport, JobHandle]], *, out: str | None = None) -> None:
        """Record the job(s) a step launched before anyone polls them, so that cancelling the run finds them.

        A step run closed meanwhile (its run was cancelled, here or by another process, as the jobs launched: the
        canceller could not see them) refuses them: the step kills them itself, sees them end, and raises
        `RunCancelled` (its record stays the canceller's). Left recorded nowhere, such a job trained on alone.
        """
        try:
            rec.attach([handle for _, handle in jobs], out=out)
        except ImmutableRecord:
            ends = "; ".join(f"job {handle.job_dir} {kill(transport, handle)}" for transport, handle in jobs)
            raise RunCancelled(f"run {self.run_id} was cancelled as {rec.record.step} launched: {ends}") from None

    def wait(self, label: str, transport: Transport, handle: JobHandle, timeout_s: float, *,
             total: int | None = None, log_format: FormatChoice | LogFormatSpec | None = None,
             step_run: str | None = None) -> JobState:
        """Poll the job until it ends, saying every `progress_every_s` where it stands: the training step its
        log has reached, of `total`, with its loss, rate and ETA (`StepProgress`).

        Every poll also reads the step run `step_run` (the one the job is recorded in): once it is closed (its run
        was cancelled, by this process or another, after the canceller looked for this job), the job is killed here
        and `RunCancelled` raised, so no step waits on a job nobody will collect."""
        tracker = ProgressTracker(label, handle.host, total=total, log_format=log_format)
        last = [-self.progress_every_s]

        def on_poll(state: JobState) -> None:
            if not state.finished and step_run is not None and self.store.get_step(step_run).finished:
                end = kill(transport, handle)
                raise RunCancelled(f"run {self.run_id} was cancelled while {label} waited on job {handle.job_dir} "
                                   f"(job {end})")
            now = time.monotonic()
            if now - last[0] < self.progress_every_s or state.finished:
                return
            last[0] = now
            try:
                tail = transport.tail(handle, PROGRESS_TAIL_BYTES)
            except AlignflowError:
                tail = ""
            note = status = ""
            if state.kind == "pending":  # in a scheduler's queue (Slurm PENDING): its reason says why
                note, status = state.note, "pending"
            elif not tail.strip():  # nothing printed yet: perhaps still waiting for a job slot on the host
                slot = transport.slot_note(handle)
                note, status = (slot, "waiting for a job slot") if slot.startswith("waiting") else ("", "")
            progress = tracker.update(status or str(state), tail, note=note)
            if progress.iteration is None and tail.strip():
                progress = replace(progress, last_output=tail.rstrip().splitlines()[-1].strip()[-160:])
            self._progress(progress)

        return transport.wait(handle, poll_s=self.poll_s, timeout_s=timeout_s, on_poll=on_poll)

    @staticmethod
    def tails(transport: Transport, handle: JobHandle | None, *, check: bool = False) -> tuple[str, str]:
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

    def read_log(self, label: str, transport: Transport, path: str, template: CommandTemplate,
                 local_name: str) -> ParsedLog:
        """Fetch a training log to `runs/<id>/logs/<local_name>.log`, parse it, check its sentinels and the lines
        a valid log contains; the parsed log."""
        local = self.state_dir / "runs" / self.run_id / "logs" / f"{local_name}.log"
        local.parent.mkdir(parents=True, exist_ok=True)
        transport.get(path, str(local), overwrite=True)
        text = local.read_text(encoding="utf-8", errors="replace")
        from alignflow.logs.parse import parse_log  # pandas: only where a log is read, not in a cached run

        parsed = parse_log(text.splitlines(), fmt=template.log_format, source=f"{label}:{path}")
        # a training that loads a checkpoint must say it loaded one (`required_lines` is set exactly for those)
        check_sentinels(parsed, require=(CHECKPOINT_LOADED,) if template.required_lines else ())
        for required in template.required_lines:
            if required not in text:
                raise SentinelError(f"{label}: the log never says {required!r} ({path}); the run is not valid (the "
                                    "weights were not loaded as expected?)", sentinels=[])
        return parsed


def kill(transport: Transport, handle: JobHandle) -> JobState:
    """Kill a job's process tree (TERM, then KILL after the grace period) and return the end it was seen to reach;
    a transport error while killing is a state too (`running`, with the error as its note): nothing may claim a kill
    it did not see."""
    try:
        return transport.cancel(handle)
    except AlignflowError as exc:
        return JobState("running", note=f"the kill could not be confirmed: {exc}")
