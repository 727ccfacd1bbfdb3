"""`Store`: experiments, runs, step runs and artifacts (snapshots, metrics, comparisons: `measurements.py`).

Public API (records are frozen dataclasses from `alignflow.store.records`; ids accept unique prefixes):
see the `alignflow.store` package docstring.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pydantic import JsonValue
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from alignflow.errors import ImmutableRecord, RecordNotFound, StoreError
from alignflow.store.base import OPEN_STEPS
from alignflow.store.goldens import Goldens
from alignflow.store.interruptions import Interruptions
from alignflow.store.measurements import Measurements
from alignflow.store.models import Artifact, Experiment, ExperimentConfig, Run, StepRun, experiment_record
from alignflow.store.params import NoiseRunParams, RunParams, encode_params
from alignflow.store.records import (
    FINISHED_RUN_STATUSES,
    OPEN_STEP_STATUSES,
    PASS_VERDICT,
    ArtifactRecord,
    ArtifactRef,
    ExperimentRecord,
    RunRecord,
    RunStatus,
    StepRunRecord,
    StepStatus,
    encode_inputs,
)
from alignflow.store.references import References
from alignflow.store.values import check_name, check_sha256, json_document, log_tail

log = logging.getLogger(__name__)


class Store(Measurements, References, Interruptions, Goldens):
    """The alignflow store: experiments, runs, step runs, artifacts, host snapshots, metrics, comparisons."""

    # --- experiments --------------------------------------------------------------------------------------------

    def ensure_experiment(self, name: str, *, config: Mapping[str, JsonValue], config_sha256: str) -> ExperimentRecord:
        """Record the experiment (once) and this configuration version of it (once per sha256)."""
        check_name(name, "experiment name", max_length=200)
        check_sha256(config_sha256, f"experiment {name!r}: config_sha256")
        doc = json_document(config, f"experiment {name!r}: config")
        # Two processes may ensure the same experiment at once; on PostgreSQL the loser of the unique constraint
        # retries and then finds the winner's row (SQLite's BEGIN IMMEDIATE serializes them anyway).
        for attempt in range(3):
            try:
                with self._write(f"ensure experiment {name!r}") as s:
                    exp = s.scalar(select(Experiment).where(Experiment.name == name))
                    if exp is None:
                        exp = Experiment(name=name, created_at=self._clock())
                        s.add(exp)
                        s.flush()
                    cfg = s.scalar(select(ExperimentConfig).where(
                        ExperimentConfig.experiment_id == exp.id, ExperimentConfig.sha256 == config_sha256))
                    if cfg is None:
                        cfg = ExperimentConfig(
                            experiment_id=exp.id, sha256=config_sha256, config=doc, created_at=self._clock()
                        )
                        s.add(cfg)
                        s.flush()
                    return experiment_record(exp, cfg)
            except StoreError as exc:
                if not isinstance(exc.__cause__, IntegrityError) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get_experiment(self, name: str) -> ExperimentRecord:
        """The experiment with its most recently recorded configuration."""
        with self._read(f"read experiment {name!r}") as s:
            exp = self._experiment_row(s, name)
            cfg = s.scalar(select(ExperimentConfig).where(ExperimentConfig.experiment_id == exp.id)
                           .order_by(ExperimentConfig.id.desc()).limit(1))
            assert cfg is not None
            return experiment_record(exp, cfg)

    def experiment_config(self, name: str, config_sha256: str) -> dict[str, JsonValue]:
        """The configuration an experiment had under `config_sha256` (what a reproduction needs)."""
        with self._read(f"read experiment {name!r}") as s:
            exp = self._experiment_row(s, name)
            cfg = s.scalar(select(ExperimentConfig).where(
                ExperimentConfig.experiment_id == exp.id, ExperimentConfig.sha256 == config_sha256))
            if cfg is None:
                raise RecordNotFound(f"experiment {name!r}: no configuration with sha256 {config_sha256}")
            return dict(cfg.config)

    # --- runs ---------------------------------------------------------------------------------------------------

    def create_run(
        self,
        experiment_name: str,
        *,
        parent_id: str | None = None,
        trigger: str,
        code_version: str,
        params: RunParams | NoiseRunParams,
        config_sha256: str | None = None,
    ) -> RunRecord:
        """Start a run of an experiment (status `running`), under its latest config unless `config_sha256` says.

        The store's `controller` function names the process driving the run (default: this one), so that a run
        whose controller died can be told from a live one (`alignflow.store.interruptions.reconcile`)."""
        check_name(trigger, "create_run: trigger", max_length=100)
        check_name(code_version, "create_run: code_version", max_length=200)
        doc = json_document(encode_params(params), "create_run: params")

        with self._write(f"create a run of {experiment_name!r}") as s:
            exp = self._experiment_row(s, experiment_name)
            query = select(ExperimentConfig).where(ExperimentConfig.experiment_id == exp.id)
            if config_sha256 is not None:
                query = query.where(ExperimentConfig.sha256 == config_sha256)
            cfg = s.scalar(query.order_by(ExperimentConfig.id.desc()).limit(1))
            if cfg is None:
                raise RecordNotFound(f"experiment {experiment_name!r}: no configuration {config_sha256}; "
                                     "record it with ensure_experiment first")
            parent = None if parent_id is None else self._resolve(s, Run, parent_id, "parent run")
            controller = self._controller()
            row = Run(id=self._fresh_id(s, Run), experiment_id=exp.id, config_id=cfg.id, parent_id=parent,
                      trigger=trigger, status=RunStatus.RUNNING.value, code_version=code_version, params=doc,
                      started_at=self._clock(),
                      controller=None if controller is None else json_document(controller, "controller"))
            s.add(row)
            s.flush()
            record = row.to_record(exp.name, cfg.sha256)
        log.info("run %s of %s started (trigger %s)", record.id, experiment_name, trigger)
        return record

    def finish_run(
        self,
        run_id: str,
        *,
        status: RunStatus | str,
        verdict: str | None = None,
        report: str | None = None,
        error: str | None = None,
    ) -> RunRecord:
        """Finish a running run, once. Steps still open are closed as `failed` (as `cancelled` when the run is
        cancelled), unless the run `completed`, which is refused while any step is open (a completed run has every
        step accounted for)."""
        final = RunStatus(status)
        if final not in FINISHED_RUN_STATUSES:
            raise ValueError(f"finish_run: status must be one of {[s.value for s in FINISHED_RUN_STATUSES]}")
        if verdict is not None:
            check_name(verdict, "finish_run: verdict", max_length=40)
        with self._write(f"finish run {run_id}") as s:
            row = self._run_row(s, run_id)
            self._require_open_run(row, "finish")
            now = self._clock()
            open_steps = list(s.scalars(
                select(StepRun).where(StepRun.run_id == row.id, StepRun.status.in_(OPEN_STEPS))))
            if open_steps and final == RunStatus.COMPLETED:
                listing = ", ".join(f"{st.step} ({st.status})" for st in open_steps)
                raise StoreError(f"run {row.id}: cannot be completed while steps are open: {listing}; "
                                 "finish or skip them first")
            closed = StepStatus.CANCELLED if final == RunStatus.CANCELLED else StepStatus.FAILED
            for st in open_steps:
                s.execute(update(StepRun).where(StepRun.id == st.id, StepRun.status.in_(OPEN_STEPS)).values(
                    status=closed.value, finished_at=now,
                    error=f"run {row.id} ended ({final.value}) while this step was {st.status}"))
            done = s.execute(
                update(Run).where(Run.id == row.id, Run.status == RunStatus.RUNNING.value).values(
                    status=final.value, verdict=verdict, report=report, error=log_tail(error), finished_at=now)
            )
            if done.rowcount != 1:  # type: ignore[attr-defined]
                raise ImmutableRecord(f"run {row.id}: was finished by another process meanwhile")
            s.refresh(row)
            record = self._run_record(s, row)
        log.info("run %s finished: %s%s", record.id, final.value, f", verdict {verdict}" if verdict else "")
        return record

    def get_run(self, run_id: str) -> RunRecord:
        """A run by id or unique id prefix."""
        with self._read(f"read run {run_id}") as s:
            return self._run_record(s, self._run_row(s, run_id))

    def list_runs(
        self, *, experiment: str | None = None, status: RunStatus | str | None = None, limit: int = 50
    ) -> list[RunRecord]:
        """Runs, newest first."""
        with self._read("list runs") as s:
            query = select(Run, Experiment.name, ExperimentConfig.sha256).join(
                Experiment, Run.experiment_id == Experiment.id).join(
                ExperimentConfig, Run.config_id == ExperimentConfig.id)
            if experiment is not None:
                query = query.where(Run.experiment_id == self._experiment_row(s, experiment).id)
            if status is not None:
                query = query.where(Run.status == RunStatus(status).value)
            query = query.order_by(Run.started_at.desc(), Run.id.desc()).limit(max(0, limit))
            return [row.to_record(name, sha) for row, name, sha in s.execute(query)]

    def last_passing_run(self, experiment: str, *, before: str | None = None,
                         config_sha256: str | None = None) -> RunRecord | None:
        """The newest completed run of `experiment` whose verdict is `pass` (started before run `before`; run
        under the configuration `config_sha256` when given)."""
        with self._read(f"find the last passing run of {experiment!r}") as s:
            exp = self._experiment_row(s, experiment)
            query = select(Run).where(Run.experiment_id == exp.id, Run.status == RunStatus.COMPLETED.value,
                                      Run.verdict == PASS_VERDICT)
            if config_sha256 is not None:
                query = query.join(ExperimentConfig, Run.config_id == ExperimentConfig.id).where(
                    ExperimentConfig.sha256 == config_sha256)
            if before is not None:
                pivot = self._run_row(s, before)
                query = query.where(Run.started_at < pivot.started_at, Run.id != pivot.id)
            row = s.scalar(query.order_by(Run.started_at.desc(), Run.id.desc()).limit(1))
            return None if row is None else self._run_record(s, row)

    def children(self, run_id: str) -> list[RunRecord]:
        """Runs that name this run as their parent (re-runs), oldest first."""
        with self._read(f"read children of run {run_id}") as s:
            parent = self._run_row(s, run_id)
            rows = s.scalars(select(Run).where(Run.parent_id == parent.id).order_by(Run.started_at, Run.id))
            return [self._run_record(s, r) for r in rows]

    # --- step runs ----------------------------------------------------------------------------------------------

    def start_step(
        self,
        run_id: str,
        step: str,
        *,
        host: str,
        command: str,
        cache_key: str,
        inputs: Mapping[str, ArtifactRef],
        status: StepStatus | str = StepStatus.RUNNING,
    ) -> StepRunRecord:
        """A new step run, `running` (or `pending`: waiting for a host; `mark_running` when it starts)."""
        initial = StepStatus(status)
        if initial not in OPEN_STEP_STATUSES:
            raise ValueError("start_step: status must be pending or running")
        check_name(step, "start_step: step", max_length=100)
        check_name(host, f"step {step}: host", max_length=200)
        check_name(cache_key, f"step {step}: cache_key", max_length=128)
        doc = json_document(encode_inputs(inputs), f"step {step}: inputs")

        with self._write(f"start step {step}") as s:
            run = self._run_row(s, run_id)
            self._require_open_run(run, f"start step {step} in")
            now = self._clock()
            row = StepRun(id=self._fresh_id(s, StepRun), run_id=run.id, step=step, host=host,
                          command=command.replace("\x00", "\ufffd"), cache_key=cache_key, inputs=doc,
                          status=initial.value, created_at=now,
                          started_at=now if initial == StepStatus.RUNNING else None)
            s.add(row)
            s.flush()
            return row.to_record()

    def mark_running(self, step_run_id: str) -> StepRunRecord:
        """A `pending` step run starts now."""
        with self._write(f"mark step run {step_run_id} running") as s:
            row = self._step_row(s, step_run_id)
            done = s.execute(update(StepRun).where(StepRun.id == row.id, StepRun.status == StepStatus.PENDING.value)
                             .values(status=StepStatus.RUNNING.value, started_at=self._clock()))
            if done.rowcount != 1:  # type: ignore[attr-defined]
                raise ImmutableRecord(f"step run {row.id} ({row.step}): is {row.status}, not pending")
            s.refresh(row)
            return row.to_record()

    def attach_job(self, step_run_id: str, *, job_dir: str, handle: Mapping[str, JsonValue]) -> StepRunRecord:
        """Record the detached job of a step run, before anyone polls it, so a restarted controller can reattach
        or cancel it. Once only: a second job needs a new step run."""
        doc = json_document(handle, f"step run {step_run_id}: job handle")
        check_name(job_dir, f"step run {step_run_id}: job_dir", max_length=4096)
        with self._write(f"attach a job to step run {step_run_id}") as s:
            row = self._step_row(s, step_run_id)
            self._require_open_step(row, "attach a job to")
            done = s.execute(update(StepRun).where(
                StepRun.id == row.id, StepRun.status.in_(OPEN_STEPS), StepRun.job_dir.is_(None)
            ).values(job_dir=job_dir, job_handle=doc))
            if done.rowcount != 1:  # type: ignore[attr-defined]
                raise ImmutableRecord(f"step run {row.id} ({row.step}): already has job {row.job_dir}; "
                                      "a second job needs a new step run")
            s.refresh(row)
            return row.to_record()

    def finish_step(
        self,
        step_run_id: str,
        *,
        status: StepStatus | str,
        exit_code: int | None,
        stdout_tail: str | None,
        stderr_tail: str | None,
        error: str | None = None,
    ) -> StepRunRecord:
        """Finish an open step run (`ran`, `failed`, `cancelled` or `skipped`), once. Tails keep their last 64 KiB."""
        final = StepStatus(status)
        if final not in (StepStatus.RAN, StepStatus.FAILED, StepStatus.CANCELLED, StepStatus.SKIPPED):
            raise ValueError("finish_step: status must be ran, failed, cancelled or skipped")
        with self._write(f"finish step run {step_run_id}") as s:
            row = self._step_row(s, step_run_id)
            self._require_open_step(row, "finish")
            done = s.execute(update(StepRun).where(StepRun.id == row.id, StepRun.status.in_(OPEN_STEPS)).values(
                status=final.value, exit_code=exit_code, finished_at=self._clock(),
                stdout_tail=log_tail(stdout_tail), stderr_tail=log_tail(stderr_tail), error=log_tail(error)))
            if done.rowcount != 1:  # type: ignore[attr-defined]
                raise ImmutableRecord(f"step run {row.id} ({row.step}): was finished by another process meanwhile")
            s.refresh(row)
            return row.to_record()

    def skip_step(self, run_id: str, step: str, *, reason: str, host: str | None = None) -> StepRunRecord:
        """Record that a step of a run did not run (not selected, upstream failed) and why."""
        check_name(step, "skip_step: step", max_length=100)

        with self._write(f"skip step {step}") as s:
            run = self._run_row(s, run_id)
            self._require_open_run(run, f"skip step {step} in")
            now = self._clock()
            row = StepRun(id=self._fresh_id(s, StepRun), run_id=run.id, step=step, host=host, inputs={},
                          status=StepStatus.SKIPPED.value, created_at=now, finished_at=now, error=log_tail(reason))
            s.add(row)
            s.flush()
            return row.to_record()

    def find_cached_step(self, step: str, cache_key: str) -> StepRunRecord | None:
        """The newest step run of `step` with this cache key that ran and succeeded (never a `cached` copy)."""
        with self._read(f"look up the cache of step {step}") as s:
            row = s.scalar(select(StepRun).where(
                StepRun.step == step, StepRun.cache_key == cache_key, StepRun.status == StepStatus.RAN.value
            ).order_by(StepRun.finished_at.desc(), StepRun.id.desc()).limit(1))
            return None if row is None else row.to_record()

    def record_cached_step(
        self,
        run_id: str,
        step: str,
        *,
        host: str,
        command: str,
        cache_key: str,
        reused_from: str,
    ) -> StepRunRecord:
        """A finished `cached` step run that reuses step run `reused_from`; its inputs and artifacts are recorded
        again under the new step run (same host, path and sha256), so every run lists its own inputs and outputs."""
        check_name(cache_key, f"step {step}: cache_key", max_length=128)

        with self._write(f"record cached step {step}") as s:
            run = self._run_row(s, run_id)
            self._require_open_run(run, f"record cached step {step} in")
            source = self._step_row(s, reused_from)
            if source.status != StepStatus.RAN.value or source.step != step or source.cache_key != cache_key:
                raise StoreError(
                    f"step {step}: cannot reuse step run {source.id} ({source.step}, {source.status}, key "
                    f"{source.cache_key}); only a step run of the same step and cache key that ran can be reused"
                )
            now = self._clock()
            ident = self._fresh_id(s, StepRun)
            row = StepRun(id=ident, run_id=run.id, step=step, host=host, command=command, cache_key=cache_key,
                          inputs=dict(source.inputs), status=StepStatus.CACHED.value, created_at=now, started_at=now,
                          finished_at=now, reused_from=source.id)
            s.add(row)
            s.flush()
            for art in s.scalars(select(Artifact).where(Artifact.step_run_id == source.id).order_by(Artifact.id)):
                s.add(Artifact(step_run_id=ident, name=art.name, host=art.host, path=art.path, kind=art.kind,
                               sha256=art.sha256, size_bytes=art.size_bytes, manifest=art.manifest, created_at=now))
            return row.to_record()

    def get_step(self, step_run_id: str) -> StepRunRecord:
        with self._read(f"read step run {step_run_id}") as s:
            return self._step_row(s, step_run_id).to_record()

    def steps(self, run_id: str) -> list[StepRunRecord]:
        """The step runs of a run, in the order they were created."""
        with self._read(f"read steps of run {run_id}") as s:
            run = self._run_row(s, run_id)
            rows = s.scalars(select(StepRun).where(StepRun.run_id == run.id)
                             .order_by(StepRun.created_at, StepRun.id))
            return [r.to_record() for r in rows]

    # --- artifacts ----------------------------------------------------------------------------------------------

    def add_artifact(
        self,
        step_run_id: str,
        *,
        name: str,
        host: str,
        path: str,
        kind: str,
        sha256: str,
        size_bytes: int,
        manifest: Sequence[Sequence[str | int]] | None = None,
    ) -> ArtifactRecord:
        """Record an output of an open step run (before `finish_step`); one artifact per name per step run."""
        check_name(name, "artifact name", max_length=200)
        check_name(host, f"artifact {name}: host", max_length=200)
        check_name(path, f"artifact {name}: path", max_length=4096)
        check_name(kind, f"artifact {name}: kind", max_length=40)
        check_sha256(sha256, f"artifact {name}: sha256")
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
            raise StoreError(f"artifact {name}: size_bytes {size_bytes!r} must be a non-negative integer")
        doc = None if manifest is None else json_document(manifest, f"artifact {name}: manifest")
        with self._write(f"add artifact {name}") as s:
            step = self._step_row(s, step_run_id)
            self._require_open_step(step, f"add artifact {name!r} to")
            if s.scalar(select(Artifact.id).where(Artifact.step_run_id == step.id, Artifact.name == name)):
                raise ImmutableRecord(f"step run {step.id} ({step.step}): already has an artifact named {name!r}")
            row = Artifact(step_run_id=step.id, name=name, host=host, path=path, kind=kind, sha256=sha256,
                           size_bytes=size_bytes, manifest=doc, created_at=self._clock())
            s.add(row)
            s.flush()
            return row.to_record()

    def artifacts(self, step_run_id: str) -> list[ArtifactRecord]:
        """The artifacts of a step run, in the order they were recorded."""
        with self._read(f"read artifacts of step run {step_run_id}") as s:
            step = self._step_row(s, step_run_id)
            rows = s.scalars(select(Artifact).where(Artifact.step_run_id == step.id).order_by(Artifact.id))
            return [r.to_record() for r in rows]

    def run_artifacts(self, run_id: str) -> list[ArtifactRecord]:
        """Every artifact of every step run of a run."""
        with self._read(f"read artifacts of run {run_id}") as s:
            run = self._run_row(s, run_id)
            rows = s.scalars(select(Artifact).join(StepRun, Artifact.step_run_id == StepRun.id)
                             .where(StepRun.run_id == run.id).order_by(Artifact.id))
            return [r.to_record() for r in rows]

    def artifacts_by_sha256(self, sha256: str) -> list[ArtifactRecord]:
        """Every recorded artifact with this digest (where the same bytes already exist), oldest first."""
        check_sha256(sha256, "artifacts_by_sha256")
        with self._read("find artifacts by sha256") as s:
            rows = s.scalars(select(Artifact).where(Artifact.sha256 == sha256).order_by(Artifact.id))
            return [r.to_record() for r in rows]
