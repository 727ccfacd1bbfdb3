"""Switch matrices and golden values (mixed into `Store`).

- `add_matrix(run_id, *, verdict, summary, report)` once per run, while it is open; `matrix(run_id)`.
- `add_golden(experiment, side, *, run_id, step_run_id, log_sha256, values, note)` records the next version of a
  side's golden values (1, 2, ...; never overwritten), `goldens(experiment, side=None)` lists them newest first,
  `golden(experiment, side)` is the newest.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from alignflow.errors import ImmutableRecord, StoreError
from alignflow.store.base import StoreBase
from alignflow.store.models import Experiment, Golden, MatrixResult
from alignflow.store.records import GoldenRecord, MatrixRecord
from alignflow.store.values import check_name, check_sha256, json_document


class Goldens(StoreBase):
    """Matrix results and golden values."""

    # --- matrices -----------------------------------------------------------------------------------------------

    def add_matrix(self, run_id: str, *, verdict: str, summary: dict[str, Any], report: str | None
                   ) -> MatrixRecord:
        check_name(verdict, "add_matrix: verdict", max_length=40)
        doc = json_document(summary, "add_matrix: summary")
        with self._write("add a matrix result") as s:
            run = self._run_row(s, run_id)
            self._require_open_run(run, "add a matrix result to")
            if s.scalar(select(MatrixResult.id).where(MatrixResult.run_id == run.id)):
                raise ImmutableRecord(f"run {run.id}: already has a matrix result")
            row = MatrixResult(run_id=run.id, verdict=verdict, summary=doc, report=report, created_at=self._clock())
            s.add(row)
            s.flush()
            return row.to_record()

    def matrix(self, run_id: str) -> MatrixRecord | None:
        with self._read(f"read the matrix of run {run_id}") as s:
            run = self._run_row(s, run_id)
            row = s.scalar(select(MatrixResult).where(MatrixResult.run_id == run.id))
            return None if row is None else row.to_record()

    # --- goldens ------------------------------------------------------------------------------------------------

    def add_golden(self, experiment: str, side: str, *, run_id: str, step_run_id: str | None, log_sha256: str,
                   values: dict[str, Any], note: str | None = None) -> GoldenRecord:
        """The next version of `side`'s golden values of `experiment`, from run `run_id`."""
        check_name(side, "add_golden: side", max_length=40)
        check_sha256(log_sha256, "add_golden: log_sha256")
        doc = json_document(values, "add_golden: values")
        for attempt in range(3):  # two recorders at once: the loser of the unique version retries
            try:
                with self._write(f"record golden values of {experiment} {side}") as s:
                    exp = self._experiment_row(s, experiment)
                    run = self._run_row(s, run_id)
                    step = None if step_run_id is None else self._step_row(s, step_run_id).id
                    last = s.scalar(select(func.max(Golden.version)).where(Golden.experiment_id == exp.id,
                                                                            Golden.side == side))
                    row = Golden(experiment_id=exp.id, side=side, version=int(last or 0) + 1, run_id=run.id,
                                 step_run_id=step, log_sha256=log_sha256, values=doc, note=note,
                                 created_at=self._clock())
                    s.add(row)
                    s.flush()
                    return row.to_record(exp.name)
            except StoreError as exc:
                if not isinstance(exc.__cause__, IntegrityError) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def goldens(self, experiment: str, side: str | None = None) -> list[GoldenRecord]:
        """Every version of the experiment's goldens (of one side), newest first."""
        with self._read(f"read golden values of {experiment}") as s:
            exp = self._experiment_row(s, experiment)
            query = select(Golden).where(Golden.experiment_id == exp.id)
            if side is not None:
                query = query.where(Golden.side == side)
            rows = s.scalars(query.order_by(Golden.side, Golden.version.desc()))
            return [r.to_record(exp.name) for r in rows]

    def golden(self, experiment: str, side: str) -> GoldenRecord | None:
        """The newest golden values of `side` of `experiment` (None: none recorded)."""
        found = self.goldens(experiment, side)
        return found[0] if found else None

    def golden_experiments(self) -> list[str]:
        """Experiments that have golden values."""
        with self._read("list experiments with golden values") as s:
            rows = s.execute(select(Experiment.name).join(Golden, Golden.experiment_id == Experiment.id).distinct())
            return sorted(name for (name,) in rows)
