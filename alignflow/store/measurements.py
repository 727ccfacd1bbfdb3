"""Measurements of a run: host snapshots, per-step metrics (long format) and the comparison with its verdict.

Metrics are stored one row per (source, metric, step): a parser's wide DataFrame (index = step, one column per
canonical metric) goes in with `add_metrics` and comes back with `metrics(..., wide=True)`. A NaN cell is stored
as NULL and read back as NaN, so a loss that a log printed as `nan` is kept, not dropped; +-inf is kept as is.
A source's metrics are recorded once per run (recording them again is `ImmutableRecord`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import JsonValue
from sqlalchemy import insert, select

from alignflow.errors import ImmutableRecord, StoreError
from alignflow.store.base import StoreBase
from alignflow.store.models import Comparison, HostSnapshot, Metric
from alignflow.store.records import ComparisonRecord, SnapshotRecord
from alignflow.store.values import check_name, json_document

if TYPE_CHECKING:
    import pandas as pd

METRIC_COLUMNS = ("source", "step_run_id", "step", "metric", "value")


class Measurements(StoreBase):
    """Snapshots, metrics and comparisons of runs (mixed into `Store`)."""

    # --- host snapshots -----------------------------------------------------------------------------------------

    def add_snapshot(self, run_id: str, host: str, data: Mapping[str, JsonValue]) -> SnapshotRecord:
        """What `host` looked like for this run (versions, commits, drivers, env); several per host allowed."""
        check_name(host, "snapshot host", max_length=200)
        doc = json_document(data, f"snapshot of {host}")
        with self._write(f"add a snapshot of {host}") as s:
            run = self._run_row(s, run_id)
            self._require_open_run(run, f"add a snapshot of {host} to")
            row = HostSnapshot(run_id=run.id, host=host, taken_at=self._clock(), data=doc)
            s.add(row)
            s.flush()
            return row.to_record()

    def snapshots(self, run_id: str) -> list[SnapshotRecord]:
        with self._read(f"read snapshots of run {run_id}") as s:
            run = self._run_row(s, run_id)
            rows = s.scalars(select(HostSnapshot).where(HostSnapshot.run_id == run.id).order_by(HostSnapshot.id))
            return [r.to_record() for r in rows]

    # --- metrics ------------------------------------------------------------------------------------------------

    def add_metrics(
        self, run_id: str, *, source: str, frame: pd.DataFrame, step_run_id: str | None = None
    ) -> int:
        """Store a wide frame (index or `step` column = training step, other columns = metrics) as long rows.

        Returns the number of rows written. Every metric column must be numeric; steps must be unique integers.
        """
        check_name(source, "add_metrics: source", max_length=100)
        rows = _long_rows(frame, f"add_metrics({source!r})")
        with self._write(f"add metrics from {source!r}") as s:
            run = self._run_row(s, run_id)
            self._require_open_run(run, f"add metrics from {source!r} to")
            step_id = None if step_run_id is None else self._step_row(s, step_run_id).id
            if s.scalar(select(Metric.id).where(Metric.run_id == run.id, Metric.source == source).limit(1)):
                raise ImmutableRecord(f"run {run.id}: already has metrics from source {source!r}")
            if rows:
                s.execute(insert(Metric), [
                    {"run_id": run.id, "step_run_id": step_id, "source": source, "step": step, "metric": metric,
                     "value": value}
                    for step, metric, value in rows
                ])
        return len(rows)

    def metrics(self, run_id: str, source: str | None = None, *, wide: bool = False) -> pd.DataFrame:
        """A run's metrics: long format (`source, step_run_id, step, metric, value`), sorted; or, with `wide=True`
        and a `source`, the parser's shape back (index `step`, one column per metric, sorted by name)."""
        import pandas as pd

        if wide and source is None:
            raise ValueError("metrics(wide=True) needs a source: steps of different sources do not share a row")
        with self._read(f"read metrics of run {run_id}") as s:
            run = self._run_row(s, run_id)
            query = select(Metric.source, Metric.step_run_id, Metric.step, Metric.metric, Metric.value).where(
                Metric.run_id == run.id)
            if source is not None:
                query = query.where(Metric.source == source)
            result = s.execute(query.order_by(Metric.source, Metric.metric, Metric.step)).all()
        long = pd.DataFrame([tuple(r) for r in result], columns=list(METRIC_COLUMNS))
        long["step"] = long["step"].astype("int64")
        long["value"] = long["value"].astype("float64")  # NULL -> NaN
        if not wide:
            return long
        table = long.pivot(index="step", columns="metric", values="value")
        table.columns.name = None
        return table

    # --- comparisons --------------------------------------------------------------------------------------------

    def add_comparison(
        self, run_id: str, *, verdict: str, criteria: Sequence[Mapping[str, JsonValue]],
        summary: Mapping[str, JsonValue],
    ) -> ComparisonRecord:
        """The comparison of a run (once per run): verdict, each criterion's result, summary statistics."""
        check_name(verdict, "add_comparison: verdict", max_length=40)
        criteria_doc = json_document(criteria, "add_comparison: criteria")
        summary_doc = json_document(summary, "add_comparison: summary")
        if not isinstance(criteria_doc, list):
            raise StoreError("add_comparison: criteria must be a list of per-criterion results")
        with self._write("add a comparison") as s:
            run = self._run_row(s, run_id)
            self._require_open_run(run, "add a comparison to")
            if s.scalar(select(Comparison.id).where(Comparison.run_id == run.id)):
                raise ImmutableRecord(f"run {run.id}: already has a comparison")
            row = Comparison(run_id=run.id, verdict=verdict, criteria=criteria_doc, summary=summary_doc,
                             created_at=self._clock())
            s.add(row)
            s.flush()
            return row.to_record()

    def comparison(self, run_id: str) -> ComparisonRecord | None:
        with self._read(f"read the comparison of run {run_id}") as s:
            run = self._run_row(s, run_id)
            row = s.scalar(select(Comparison).where(Comparison.run_id == run.id))
            return None if row is None else row.to_record()


def _long_rows(frame: pd.DataFrame, where: str) -> list[tuple[int, str, float | None]]:
    """(step, metric, value) rows of a wide frame; NaN -> None. Fails naming what is wrong with the frame."""
    import pandas as pd
    from pandas.api import types as ptypes

    if not isinstance(frame, pd.DataFrame):
        raise StoreError(f"{where}: expected a pandas DataFrame, got {type(frame).__name__}")
    table = frame.set_index("step") if "step" in frame.columns else frame
    steps = table.index
    if not (ptypes.is_integer_dtype(steps.dtype) or len(steps) == 0):
        raise StoreError(f"{where}: the step index must hold integers (got {steps.dtype})")
    if steps.has_duplicates:
        dupes = sorted({int(x) for x in steps[steps.duplicated()]})[:10]
        raise StoreError(f"{where}: duplicate steps {dupes}")
    bad = [str(c) for c in table.columns
           if not (ptypes.is_numeric_dtype(table[c].dtype) or ptypes.is_bool_dtype(table[c].dtype))]
    if bad:
        raise StoreError(f"{where}: columns {bad} are not numeric; metrics are numbers (drop or convert them)")
    long_names = [str(c) for c in table.columns if len(str(c)) > 100 or not str(c).strip()]
    if long_names:
        raise StoreError(f"{where}: metric names {long_names} must be 1 to 100 characters")
    rows: list[tuple[int, str, float | None]] = []
    for column in table.columns:
        values = table[column].astype("float64").tolist()
        for step, value in zip(steps.tolist(), values, strict=True):
            rows.append((int(step), str(column), None if math.isnan(value) else value))
    return rows
