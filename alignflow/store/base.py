"""`StoreBase`: opening the database, one transaction per call, id resolution, and the immutability checks.

Every public method of the store is one short transaction on a session of its own, so one `Store` may be
shared by the threads of a flow; callers never see a Session or an ORM object. Writes that change a row are
conditional (`UPDATE ... WHERE status IN (open statuses)`), which is what makes a finished record immutable even
when two processes race: the loser gets `ImmutableRecord`, never a silent overwrite.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from alignflow import state
from alignflow.errors import ImmutableRecord, RecordNotFound, StoreError
from alignflow.store import database
from alignflow.store.models import Experiment, ExperimentConfig, Run, StepRun
from alignflow.store.records import OPEN_STEP_STATUSES, RunRecord, RunStatus, utc_now
from alignflow.store.values import check_id_prefix, new_id

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
# Who is creating a run (recorded with it so that a dead controller can be detected later); None records nothing.
ControllerFn = Callable[[], dict[str, Any] | None]
OPEN_STEPS = [s.value for s in OPEN_STEP_STATUSES]


def _this_process() -> dict[str, Any]:
    from alignflow.controller import current

    return current().to_dict()


class StoreBase:
    """Connection handling and the helpers every part of the store API shares."""

    def __init__(self, engine: Engine, *, clock: Clock = utc_now, controller: ControllerFn | None = None) -> None:
        self._engine = engine
        self._read_engine = engine.execution_options(**{database.READ_ONLY_OPTION: True})
        self._clock = clock
        self._controller = controller or _this_process

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        state_dir: Path | None = None,
        upgrade: bool = True,
        clock: Clock = utc_now,
        controller: ControllerFn | None = None,
    ) -> Self:
        """Open the store at `url`, else `$ALIGNFLOW_DB_URL`, else SQLite in `state_dir` (default: the state dir).

        With `upgrade=True` (what the CLI and the flow use) a schema behind the migrations is upgraded first;
        with `upgrade=False` it raises StoreSchemaError saying to run `alignflow db upgrade`.
        """
        engine = database.create_store_engine(url or state.database_url(state_dir))
        try:
            database.require_current(engine, upgrade_if_behind=upgrade)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, clock=clock, controller=controller)

    @property
    def url(self) -> str:
        """The database URL, password masked."""
        return database.mask_url(self._engine.url)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transactions -------------------------------------------------------------------------------------------

    @contextmanager
    def _write(self, what: str) -> Iterator[Session]:
        try:
            with Session(self._engine, expire_on_commit=False, info={"write": True}) as session, session.begin():
                yield session
        except IntegrityError as exc:
            raise StoreError(f"{self.url}: {what}: rejected by the database: {database.first_line(exc)}") from exc
        except SQLAlchemyError as exc:
            raise database.store_error(self.url, what, exc) from exc

    @contextmanager
    def _read(self, what: str) -> Iterator[Session]:
        try:
            with Session(self._read_engine, expire_on_commit=False) as session, session.begin():
                yield session
        except SQLAlchemyError as exc:
            raise database.store_error(self.url, what, exc) from exc

    @staticmethod
    def _fresh_id(s: Session, model: type[Run] | type[StepRun]) -> str:
        """A new public id not yet used in `model` (48 random bits; a collision only costs another draw)."""
        while True:
            ident = new_id()
            if s.get(model, ident) is None:
                return ident

    # --- lookups ------------------------------------------------------------------------------------------------

    @staticmethod
    def _resolve(s: Session, model: type[Run] | type[StepRun], ident: str, what: str) -> str:
        """The full id for a full id or a unique prefix; RecordNotFound otherwise (listing the candidates)."""
        check_id_prefix(ident, what)
        matches = list(s.scalars(select(model.id).where(model.id.startswith(ident)).order_by(model.id).limit(6)))
        if ident in matches:
            return ident
        if not matches:
            raise RecordNotFound(f"{what} {ident!r}: no such id - see `alignflow history`")
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise RecordNotFound(f"{what} {ident!r}: ambiguous prefix, matches {shown}; give more characters")
        return matches[0]

    @staticmethod
    def _locked(s: Session) -> bool:
        # In a write transaction every run / step-run row is read FOR UPDATE (PostgreSQL; SQLite's BEGIN IMMEDIATE
        # already serializes writers): a step cannot be started in a run that another process is finishing.
        return bool(s.info.get("write"))

    def _run_row(self, s: Session, run_id: str) -> Run:
        lock = self._locked(s)
        row = s.get(Run, self._resolve(s, Run, run_id, "run"), with_for_update=lock, populate_existing=lock)
        assert row is not None
        return row

    def _step_row(self, s: Session, step_run_id: str) -> StepRun:
        lock = self._locked(s)
        row = s.get(StepRun, self._resolve(s, StepRun, step_run_id, "step run"), with_for_update=lock,
                    populate_existing=lock)
        assert row is not None
        return row

    @staticmethod
    def _experiment_row(s: Session, name: str) -> Experiment:
        row = s.scalar(select(Experiment).where(Experiment.name == name))
        if row is None:
            known = list(s.scalars(select(Experiment.name).order_by(Experiment.name).limit(20)))
            listing = ", ".join(known) if known else "none yet"
            raise RecordNotFound(f"experiment {name!r}: not in the store; recorded experiments: {listing}")
        return row

    @staticmethod
    def _run_record(s: Session, row: Run) -> RunRecord:
        exp = s.get(Experiment, row.experiment_id)
        cfg = s.get(ExperimentConfig, row.config_id)
        assert exp is not None
        assert cfg is not None
        return row.to_record(exp.name, cfg.sha256)

    def _require_open_run(self, row: Run, action: str) -> None:
        if row.status != RunStatus.RUNNING:
            raise ImmutableRecord(
                f"run {row.id}: is {row.status}; cannot {action} a finished run - a re-run is a new run with "
                f"parent {row.id}"
            )

    @staticmethod
    def _require_open_step(row: StepRun, action: str) -> None:
        if row.status not in OPEN_STEPS:
            raise ImmutableRecord(
                f"step run {row.id} ({row.step}): is {row.status}; cannot {action} a finished step run"
            )

