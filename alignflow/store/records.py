"""What the store hands out: statuses and frozen records (never ORM objects, never a Session); `ArtifactRef`, what a
step run records of each of its inputs, and the codec of those records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import JsonValue, TypeAdapter, ValidationError

from alignflow.errors import ConfigError
from alignflow.fingerprint import Fingerprint
from alignflow.store.params import NoiseRunParams, RunParams, decode_params, experiment_file

PASS_VERDICT = "pass"


def utc_now() -> datetime:
    """The store's default clock: timezone-aware UTC."""
    return datetime.now(UTC)


class RunStatus(StrEnum):
    """Life of a run. `completed` says the pipeline ran to its end; whether the two sides align is the verdict.

    `interrupted`: the controller that drove the run died (kill -9, crash, reboot) and a later command noticed
    (`alignflow.store.interruptions.reconcile`); its remote jobs may still be running. It is the one finished
    status that may change once more, to `cancelled`, when `alignflow cancel` has killed those jobs.

    `error`: the run stopped on a configuration or environment cause (a bad file, a preflight mismatch, a host it
    could not reach, data whose sha256 differs): it says nothing about the alignment, has no verdict and is never
    a regression baseline. `failed`: a step itself failed (a training crashed, a conversion refused the weights,
    the early gate found the sides apart).
    """

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ERROR = "error"
    CANCELLED = "cancelled"
    CRASHED = "crashed"
    INTERRUPTED = "interrupted"


class StepStatus(StrEnum):
    """Life of one step run: `ran` = executed and succeeded; `cached` = reused the outputs of an earlier `ran`."""

    PENDING = "pending"
    RUNNING = "running"
    RAN = "ran"
    CACHED = "cached"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


OPEN_STEP_STATUSES = (StepStatus.PENDING, StepStatus.RUNNING)
FINISHED_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.ERROR, RunStatus.CANCELLED,
                         RunStatus.CRASHED, RunStatus.INTERRUPTED)


@dataclass(frozen=True, slots=True)
class ExperimentRecord:
    """An experiment and the configuration version last ensured for it."""

    id: int
    name: str
    config_sha256: str
    config: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One execution of an experiment's pipeline (a re-run is a new run pointing at its parent)."""

    id: str
    experiment: str
    config_sha256: str
    parent_id: str | None
    trigger: str
    status: RunStatus
    code_version: str
    verdict: str | None
    report: str | None
    error: str | None
    # The parameters as the store keeps them (`alignflow.store.params`): read them through `params`.
    stored_params: dict[str, JsonValue]
    started_at: datetime
    finished_at: datetime | None
    # The process that drives the run (`alignflow.controller.ControllerIdentity.to_dict()`); None for runs
    # recorded before it was kept (schema revision 0003).
    controller: dict[str, Any] | None = None

    @property
    def params(self) -> RunParams | NoiseRunParams:
        """What the run was started with, decoded from any version of its stored document (`StoreError` when
        this alignflow cannot read it)."""
        return decode_params(self.stored_params, run=self.id)

    def alignment_params(self) -> RunParams:
        """`params` of an alignment run; `ConfigError` for a run of another kind (a noise-floor measurement), which
        has no experiment to run again."""
        params = self.params
        if not isinstance(params, RunParams):
            raise ConfigError(f"run {self.id} is a {params.kind} run (trigger {self.trigger}), not an alignment run")
        return params

    @property
    def experiment_file(self) -> str | None:
        """The experiment file the run read (None for a noise run), even when its parameters no longer read."""
        return experiment_file(self.stored_params)

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to finish; None while running."""
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    @property
    def finished(self) -> bool:
        return self.status != RunStatus.RUNNING


@dataclass(frozen=True, slots=True)
class StepRunRecord:
    """One attempt at one pipeline step inside a run."""

    id: str
    run_id: str
    step: str
    host: str | None
    command: str | None
    cache_key: str | None
    inputs: dict[str, JsonValue]  # as recorded: `input_ref` reads a reference back
    status: StepStatus
    exit_code: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    stdout_tail: str | None
    stderr_tail: str | None
    job_dir: str | None
    job_handle: dict[str, Any] | None
    error: str | None
    reused_from: str | None

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    @property
    def finished(self) -> bool:
        return self.status not in OPEN_STEP_STATUSES

    def input_ref(self, name: str) -> ArtifactRef | None:
        """The recorded reference of input `name` (None: the step had no such input; see `input_refs`)."""
        return input_refs(self.inputs).get(name)


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """A fingerprinted output of a step run, where it lives (host + path)."""

    id: int
    step_run_id: str
    name: str
    host: str
    path: str
    kind: str
    sha256: str
    size_bytes: int
    manifest: list[Any] | dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """What a host looked like when a run used it (versions, commits, drivers, env)."""

    id: int
    run_id: str
    host: str
    taken_at: datetime
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ComparisonRecord:
    """The comparison of a run: its verdict, every criterion's result and the summary statistics."""

    id: int
    run_id: str
    verdict: str
    criteria: list[dict[str, Any]]
    summary: dict[str, Any]
    created_at: datetime

    @property
    def passed(self) -> bool:
        return self.verdict == PASS_VERDICT


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """An artifact on a host, with the fingerprint it had when it was recorded; passed between steps as plain data
    and recorded as the inputs of the step runs that read it (`encode_inputs`)."""

    name: str
    host: str
    path: str
    sha256: str
    size: int
    kind: str
    manifest: list[list[Any]] | None = field(default=None, compare=False)

    @classmethod
    def from_record(cls, record: ArtifactRecord) -> ArtifactRef:
        """The reference of an artifact row of the store."""
        manifest = record.manifest if isinstance(record.manifest, list) else None
        return cls(record.name, record.host, record.path, record.sha256, record.size_bytes, record.kind, manifest)

    def short(self) -> str:
        return f"{self.name}@{self.host}:{self.path} ({self.sha256[:12]})"

    @classmethod
    def from_fingerprint(cls, name: str, host: str, path: str, fp: Fingerprint, kind: str) -> ArtifactRef:
        """The reference of `path` on `host` as just fingerprinted there (a directory keeps its manifest)."""
        manifest = [[f.path, f.sha256, f.size] for f in fp.files] if fp.kind == "dir" else None
        return cls(name, host, path, fp.sha256, fp.size, kind, manifest)


_REF: TypeAdapter[ArtifactRef] = TypeAdapter(ArtifactRef)
_INPUTS: TypeAdapter[dict[str, ArtifactRef]] = TypeAdapter(dict[str, ArtifactRef])


def encode_inputs(inputs: Mapping[str, ArtifactRef]) -> dict[str, JsonValue]:
    """The document a step run keeps of its inputs: name -> every field of the reference."""
    doc: dict[str, JsonValue] = _INPUTS.dump_python(dict(inputs), mode="json")
    return doc


def input_refs(doc: Mapping[str, JsonValue]) -> dict[str, ArtifactRef]:
    """The references a step run's recorded inputs hold (`encode_inputs`), leaving out those the first alignflow
    recorded as a bare sha256 (a cached step's inputs, in its first days)."""
    refs: dict[str, ArtifactRef] = {}
    for name, ref in doc.items():
        if isinstance(ref, Mapping):
            try:
                refs[name] = _REF.validate_python(ref)
            except ValidationError:
                continue
    return refs


@dataclass(frozen=True, slots=True)
class MatrixRecord:
    """The switch matrix of a run: its verdict, the rows and variants (`alignflow.matrix.MatrixResult.to_json`)
    and where its report is."""

    id: int
    run_id: str
    verdict: str
    summary: dict[str, Any]
    report: str | None
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)


@dataclass(frozen=True, slots=True)
class GoldenRecord:
    """One version of one side's golden values (`values`: metric -> {step: value}, memory per rank)."""

    id: int
    experiment: str
    side: str
    version: int
    run_id: str
    step_run_id: str | None
    log_sha256: str
    values: dict[str, Any]
    note: str | None
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        return _as_json(self)


def _as_json(record: MatrixRecord | GoldenRecord) -> dict[str, Any]:
    """A record as a JSON document (datetimes in ISO 8601)."""
    doc: dict[str, Any] = TypeAdapter(type(record)).dump_python(record, mode="json")
    return doc
