"""SQLAlchemy 2.x models of the store: the tables behind the records of `alignflow.store.records`.

These classes stay inside `alignflow.store`. The schema is owned by the Alembic migrations in `migrations/`
(generated from these models; `tests/store` checks that models and migrations agree on both backends).

Conventions: public ids of runs and step runs are 12 hex characters (short enough to type, unique prefixes
accepted); the other tables use integer keys. Times are timezone-aware UTC (SQLite keeps them naive; the
records put UTC back). JSON columns are JSONB on PostgreSQL. Constraint names follow one naming convention so
that migrations are identical on both backends.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from alignflow.store.records import (
    ArtifactRecord,
    ComparisonRecord,
    ExperimentRecord,
    GoldenRecord,
    MatrixRecord,
    RunRecord,
    RunStatus,
    SnapshotRecord,
    StepRunRecord,
    StepStatus,
)
from alignflow.store.values import ID_LENGTH

JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit key for the big metrics table.
BigIntKey = BigInteger().with_variant(Integer(), "sqlite")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _in(column: str, values: type[RunStatus] | type[StepStatus]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


def aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything stored is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _aware(value: datetime) -> datetime:
    result = aware(value)
    assert result is not None
    return result


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy's declared class attribute
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
    }


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime]


class ExperimentConfig(Base):
    """Every configuration an experiment has been run with (a changed YAML adds a row; none is overwritten)."""

    __tablename__ = "experiment_configs"
    __table_args__ = (UniqueConstraint("experiment_id", "sha256"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    sha256: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(_in("status", RunStatus), name="status"),
        Index(None, "experiment_id", "started_at"),
        Index(None, "started_at"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"))
    config_id: Mapped[int] = mapped_column(ForeignKey("experiment_configs.id"))
    parent_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id"), index=True)
    trigger: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16))
    code_version: Mapped[str] = mapped_column(String(200))
    verdict: Mapped[str | None] = mapped_column(String(40))
    report: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    params: Mapped[dict[str, Any]]
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    controller: Mapped[dict[str, Any] | None]

    def to_record(self, experiment: str, config_sha256: str) -> RunRecord:
        return RunRecord(
            id=self.id, experiment=experiment, config_sha256=config_sha256, parent_id=self.parent_id,
            trigger=self.trigger, status=RunStatus(self.status), code_version=self.code_version,
            verdict=self.verdict, report=self.report, error=self.error, stored_params=dict(self.params),
            started_at=_aware(self.started_at), finished_at=aware(self.finished_at),
            controller=None if self.controller is None else dict(self.controller),
        )


class StepRun(Base):
    __tablename__ = "step_runs"
    __table_args__ = (
        CheckConstraint(_in("status", StepStatus), name="status"),
        # find_cached_step: the latest successful run of (step, cache key)
        Index(None, "step", "cache_key", "status"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    step: Mapped[str] = mapped_column(String(100))
    host: Mapped[str | None] = mapped_column(String(200))
    command: Mapped[str | None] = mapped_column(Text)
    cache_key: Mapped[str | None] = mapped_column(String(128))
    inputs: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None]
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    stdout_tail: Mapped[str | None] = mapped_column(Text)
    stderr_tail: Mapped[str | None] = mapped_column(Text)
    job_dir: Mapped[str | None] = mapped_column(Text)
    job_handle: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    reused_from: Mapped[str | None] = mapped_column(ForeignKey("step_runs.id"), index=True)

    def to_record(self) -> StepRunRecord:
        return StepRunRecord(
            id=self.id, run_id=self.run_id, step=self.step, host=self.host, command=self.command,
            cache_key=self.cache_key, inputs=dict(self.inputs), status=StepStatus(self.status),
            exit_code=self.exit_code, created_at=_aware(self.created_at), started_at=aware(self.started_at),
            finished_at=aware(self.finished_at), stdout_tail=self.stdout_tail, stderr_tail=self.stderr_tail,
            job_dir=self.job_dir, job_handle=None if self.job_handle is None else dict(self.job_handle),
            error=self.error, reused_from=self.reused_from,
        )


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("step_run_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    step_run_id: Mapped[str] = mapped_column(ForeignKey("step_runs.id"))
    name: Mapped[str] = mapped_column(String(200))
    host: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(40))
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    manifest: Mapped[Any | None] = mapped_column(JSONType)
    created_at: Mapped[datetime]

    def to_record(self) -> ArtifactRecord:
        return ArtifactRecord(
            id=self.id, step_run_id=self.step_run_id, name=self.name, host=self.host, path=self.path,
            kind=self.kind, sha256=self.sha256, size_bytes=self.size_bytes, manifest=self.manifest,
            created_at=_aware(self.created_at),
        )


class HostSnapshot(Base):
    __tablename__ = "host_snapshots"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    host: Mapped[str] = mapped_column(String(200))
    taken_at: Mapped[datetime]
    data: Mapped[dict[str, Any]]

    def to_record(self) -> SnapshotRecord:
        return SnapshotRecord(
            id=self.id, run_id=self.run_id, host=self.host, taken_at=_aware(self.taken_at), data=dict(self.data)
        )


class Metric(Base):
    """One value of one metric at one training step, from one source (e.g. `npu`, `gpu`), in long format."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("run_id", "source", "metric", "step"),)

    id: Mapped[int] = mapped_column(BigIntKey, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    step_run_id: Mapped[str | None] = mapped_column(ForeignKey("step_runs.id"), index=True)
    source: Mapped[str] = mapped_column(String(100))
    step: Mapped[int] = mapped_column(Integer)
    metric: Mapped[str] = mapped_column(String(100))
    value: Mapped[float | None] = mapped_column(Double)  # NULL = NaN (a value the log printed as nan)


class Comparison(Base):
    __tablename__ = "comparisons"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), unique=True)
    verdict: Mapped[str] = mapped_column(String(40))
    criteria: Mapped[list[Any]]
    summary: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]

    def to_record(self) -> ComparisonRecord:
        return ComparisonRecord(
            id=self.id, run_id=self.run_id, verdict=self.verdict, criteria=list(self.criteria),
            summary=dict(self.summary), created_at=_aware(self.created_at),
        )


class MatrixResult(Base):
    """The switch matrix of a run (`variants:`): its verdict, every row and variant (`MatrixResult.to_json`), the
    report directory. Once per run; the variants' own runs point at the run as their parent."""

    __tablename__ = "matrices"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), unique=True)
    verdict: Mapped[str] = mapped_column(String(40))
    summary: Mapped[dict[str, Any]]
    report: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]

    def to_record(self) -> MatrixRecord:
        return MatrixRecord(id=self.id, run_id=self.run_id, verdict=self.verdict, summary=dict(self.summary),
                            report=self.report, created_at=_aware(self.created_at))


class Golden(Base):
    """Golden values of one side of one experiment (or matrix variant), versioned: each `golden record` adds the
    next version, taken from the run it names; a check uses the newest."""

    __tablename__ = "goldens"
    __table_args__ = (UniqueConstraint("experiment_id", "side", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    side: Mapped[str] = mapped_column(String(40))
    version: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    step_run_id: Mapped[str | None] = mapped_column(ForeignKey("step_runs.id"))
    log_sha256: Mapped[str] = mapped_column(String(64))
    values: Mapped[dict[str, Any]]
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]

    def to_record(self, experiment: str) -> GoldenRecord:
        return GoldenRecord(id=self.id, experiment=experiment, side=self.side, version=self.version,
                            run_id=self.run_id, step_run_id=self.step_run_id, log_sha256=self.log_sha256,
                            values=dict(self.values), note=self.note, created_at=_aware(self.created_at))


def experiment_record(experiment: Experiment, config: ExperimentConfig) -> ExperimentRecord:
    return ExperimentRecord(
        id=experiment.id, name=experiment.name, config_sha256=config.sha256, config=dict(config.config),
        created_at=_aware(experiment.created_at),
    )
