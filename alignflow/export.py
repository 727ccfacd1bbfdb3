"""Exports of a recorded run to where these users already look: TensorBoard and MLflow (issue 20).

- `export_tensorboard(series, log_dir)`: one TensorBoard run (`<log_dir>/<run id>/`) with every metric of both
  sides as scalars `<metric>/<side>` and the per-step error `<metric>/error`, written with TensorBoard's own
  writer (`tensorboard.summary.Writer`), plus a custom-scalars layout that overlays the sides in one chart.
- `export_mlflow(series, tracking_uri)`: two MLflow runs (NPU and GPU) in the experiment named after the
  alignflow experiment, tagged with the alignflow run id and side, the criteria and every fingerprint as
  params and the criteria's results as tags, the metrics per step; through MLflow's own client.

Both refuse to write a run that was already exported there (nothing is appended twice or overwritten). The
series come from the store (`run_series`): each side's metrics as its training step recorded them, also when
the step was reused from an earlier run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignflow.errors import AlignflowError

if TYPE_CHECKING:
    import pandas as pd

    from alignflow.runview import RunView

# side label -> (the step that trains it, the metrics source its log is recorded under)
SIDES: dict[str, tuple[str, str]] = {"NPU": ("npu_reload_train", "npu"), "GPU": ("gpu_train", "gpu")}
MLFLOW_BATCH = 1000  # MLflow's limit of metrics per log_batch call
TAG_RUN_ID, TAG_SIDE = "alignflow.run_id", "alignflow.side"


class ExportError(AlignflowError):
    """An export that cannot be written (already exported, nothing to export, the target refused it)."""


class NothingToExport(ExportError):
    """The run recorded no training metrics (it ended before either side trained)."""


@dataclass(frozen=True, slots=True)
class RunSeries:
    """What an export writes: the run's view and each side's per-step metrics (index step, one column each)."""

    view: RunView
    sides: Mapping[str, pd.DataFrame]


def run_series(store: Any, run_id: str) -> RunSeries:
    """Both sides' recorded metrics of run `run_id` (a side whose training step never ran is left out)."""
    from alignflow.runview import run_view

    view = run_view(store, run_id)
    sides: dict[str, pd.DataFrame] = {}
    for label, (step, source) in SIDES.items():
        sv = view.step(step)
        if sv is None or sv.status not in ("ran", "cached"):
            continue
        origin = store.get_step(sv.reused_from) if sv.reused_from else store.get_step(sv.step_run_id)
        long = store.metrics(origin.run_id, source)
        long = long[long["step_run_id"] == origin.id]
        if not long.empty:
            wide = long.pivot(index="step", columns="metric", values="value")
            wide.columns.name = None
            sides[label] = wide.sort_index()
    if not sides:
        raise NothingToExport(f"run {view.run_id}: no training metrics recorded (steps "
                          f"{', '.join(s for s, _ in SIDES.values())} did not run); nothing to export")
    return RunSeries(view, sides)


def export_run(store: Any, run_id: str, *, tensorboard: str | Path | None = None, mlflow: str | None = None
               ) -> list[str]:
    """Export run `run_id` to the targets given; one line per target saying where it went."""
    series = run_series(store, run_id)
    done: list[str] = []
    if tensorboard is not None:
        out = export_tensorboard(series, tensorboard)
        done.append(f"tensorboard: {out} (tensorboard --logdir {tensorboard})")
    if mlflow:
        runs = export_mlflow(series, mlflow)
        done.append(f"mlflow: {mlflow}: " + ", ".join(f"{side} run {rid}" for side, rid in runs.items()))
    return done


def export_tensorboard(series: RunSeries, log_dir: str | Path) -> Path:
    """Write the run as one TensorBoard run under `log_dir`; returns its directory."""
    from tensorboard.summary import Writer
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    out = Path(log_dir) / series.view.run_id
    if out.exists() and any(out.glob("events.out.tfevents.*")):
        raise ExportError(f"{out}: run {series.view.run_id} was already exported there; remove it to export again")
    out.mkdir(parents=True, exist_ok=True)
    metrics = _metric_order(series)
    writer = Writer(str(out))
    try:
        for label, frame in series.sides.items():
            for metric in metrics:
                if metric in frame.columns:
                    for step, value in frame[metric].items():
                        if math.isfinite(value):
                            writer.add_scalar(f"{metric}/{label}", float(value), int(step))
        if {"NPU", "GPU"} <= set(series.sides):
            npu, gpu = series.sides["NPU"], series.sides["GPU"]
            for metric in metrics:
                if metric in npu.columns and metric in gpu.columns:
                    error = (npu[metric] - gpu[metric]).dropna()
                    for step, value in error.items():
                        if math.isfinite(value):
                            writer.add_scalar(f"{metric}/error", float(value), int(step),
                                              description="NPU - GPU at the step")
        writer.flush()
    finally:
        writer.close()
    layout = EventFileWriter(str(out))
    try:
        layout.add_event(_layout_event(metrics, list(series.sides)))
    finally:
        layout.close()
    return out


def _layout_event(metrics: list[str], sides: list[str]) -> Any:
    """A custom-scalars layout (TensorBoard's `custom_scalars` plugin): one chart per metric with every side.

    Built from the plugin's own protos and metadata; the plugin's `summary.pb` would import TensorFlow for the
    string tensor, which this is, written directly.
    """
    import re

    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    charts = [layout_pb2.Chart(title=m, multiline=layout_pb2.MultilineChartContent(
        tag=[rf"^{re.escape(m)}/({'|'.join(map(re.escape, sides))})$"])) for m in metrics]
    layout = layout_pb2.Layout(category=[layout_pb2.Category(title="alignflow: both sides", chart=charts)])
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[layout.SerializeToString()],
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto())
    value = summary_pb2.Summary.Value(tag=metadata.CONFIG_SUMMARY_TAG, tensor=tensor,
                                      metadata=metadata.create_summary_metadata())
    return event_pb2.Event(summary=summary_pb2.Summary(value=[value]), step=0, wall_time=0.0)


def export_mlflow(series: RunSeries, tracking_uri: str) -> dict[str, str]:
    """Write one MLflow run per side into `tracking_uri`; returns side -> MLflow run id."""
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    view = series.view
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment = client.get_experiment_by_name(view.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(view.experiment, tags={"alignflow.experiment": view.experiment}))
        done = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_RUN_ID}` = '{view.run_id}'")
        if done:
            raise ExportError(f"{tracking_uri}: run {view.run_id} was already exported to experiment "
                              f"{view.experiment!r} (MLflow runs {', '.join(r.info.run_id for r in done)})")
        params = _params(view)
        started_ms = int(view.started.timestamp() * 1000)
        out: dict[str, str] = {}
        for label, frame in series.sides.items():
            tags = {TAG_RUN_ID: view.run_id, TAG_SIDE: label, "alignflow.experiment": view.experiment,
                    "alignflow.verdict": view.verdict or "none", "alignflow.status": view.status,
                    "mlflow.note.content": f"alignflow run {view.run_id}, {label} side (error = NPU - GPU)",
                    **_criteria_tags(view)}
            run = client.create_run(experiment_id, start_time=started_ms, tags=tags, run_name=f"{view.run_id} {label}")
            rid = run.info.run_id
            client.log_batch(rid, params=[Param(k, v) for k, v in params.items()])
            metrics = [Metric(str(m), float(v), started_ms, int(step)) for m in _metric_order(series)
                       if m in frame.columns for step, v in frame[m].items() if math.isfinite(v)]
            for i in range(0, len(metrics), MLFLOW_BATCH):
                client.log_batch(rid, metrics=metrics[i:i + MLFLOW_BATCH])
            client.set_terminated(rid, status="FINISHED" if view.status == "completed" else "FAILED")
            out[label] = rid
        return out
    except MlflowException as exc:
        raise ExportError(f"{tracking_uri}: MLflow refused the export: {exc.message}") from None


def _params(view: RunView) -> dict[str, str]:
    """Criteria (as judged) and every fingerprint of the run: what defines the experiment, as MLflow params."""
    params = {"alignflow.run_id": view.run_id, "alignflow.code_version": view.code_version}
    params.update({f"criterion.{i}": c.label for i, c in enumerate(view.criteria)})
    for s in view.steps:
        for a in s.artifacts:
            params[f"sha256.{s.step}.{a.name}"] = a.sha256
        for name, ref in s.inputs.items():
            if isinstance(ref, Mapping) and ref.get("sha256"):
                params.setdefault(f"sha256.input.{name}", str(ref["sha256"]))
    return params


def _criteria_tags(view: RunView) -> dict[str, str]:
    tags: dict[str, str] = {}
    for i, c in enumerate(view.criteria):
        tags[f"criterion.{i}.result"] = "PASS" if c.passed else "FAIL"
        tags[f"criterion.{i}.value"] = c.value_text
        if c.first_outside is not None:
            tags[f"criterion.{i}.first_outside"] = str(c.first_outside)
        if c.driving_steps:
            tags[f"criterion.{i}.driving_steps"] = ",".join(map(str, c.driving_steps))
    return tags


def _metric_order(series: RunSeries) -> list[str]:
    from alignflow.logs.schema import column_order

    return column_order(sorted({str(c) for f in series.sides.values() for c in f.columns}))

