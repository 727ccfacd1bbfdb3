"""Exports of a recorded run to where these users already look: TensorBoard and MLflow (issues 20, 40).

Each is laid out the way its tool shows runs side by side, so its default view compares the two sides:

- `export_tensorboard(series, log_dir)`: under `<log_dir>/<run id>/`, one TensorBoard run per side (`NPU/`, `GPU/`)
  with the same tags (`lm_loss`, `grad_norm`, ...), so the scalars dashboard draws both sides' curves in one chart
  per metric, and one run `error/` with the per-step error NPU - GPU (`error/<metric>`); written with TensorBoard's
  own writer (`tensorboard.summary.Writer`).
- `export_mlflow(series, tracking_uri)`: in the MLflow experiment named after the alignflow experiment, a parent run
  for the alignflow run (parameters: the training, the model, the data fingerprint, the criteria and every
  artifact's sha256; metrics: each criterion's value and pass (1/0) and the per-step error; artifacts: the report
  directory, report.html and the aligned CSV included) and one child run per side (`mlflow.parentRunId`; the side's
  host, device and framework versions as parameters, its per-step metrics as metrics), so selecting the two
  children overlays their curves. Through MLflow's own client. `default_mlflow_uri(state)` is the local default,
  a SQLite tracking store under the state dir (MLflow 3 keeps no file stores).

Both refuse to write a run that was already exported there (nothing is appended twice or overwritten), and both
write all or nothing, whoever is killed when (issue 33): the TensorBoard run is a staged directory
(`alignflow.staging`), the MLflow runs are tagged complete together at the end, and what a killed export left is
removed by the next export once its process is known dead. The series come from the store (`run_series`): each
side's metrics as its training step recorded them, also when the step was reused from an earlier run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignflow import controller
from alignflow.errors import AlignflowError, ConfigError
from alignflow.pipeline import REFERENCE, TEST, SideDef
from alignflow.pipeline import SIDES as PIPELINE_SIDES

if TYPE_CHECKING:
    import pandas as pd

    from alignflow.runview import RunView

# side label -> the side (the step that trains it, its metrics source and experiment section are its name)
SIDES: dict[str, SideDef] = {s.label: s for s in PIPELINE_SIDES}
ERROR_RUN = "error"  # the TensorBoard run of the per-step error NPU - GPU
MLFLOW_BATCH = 1000  # MLflow's limit of metrics per log_batch call
MLFLOW_PARAM_BATCH = 100  # and of params (and of tags)
MLFLOW_PARAM_CHARS = 6000  # the longest param value MLflow keeps
TAG_RUN_ID, TAG_SIDE, TAG_PARENT = "alignflow.run_id", "alignflow.side", "mlflow.parentRunId"
MLFLOW_DB = Path("mlflow") / "mlflow.db"  # under the state dir: the local default tracking store
# An export's MLflow runs share an id; `partial` until all of them are written, then `complete` together.
TAG_EXPORT_ID, TAG_EXPORT_RUNS = "alignflow.export_id", "alignflow.export_runs"
TAG_EXPORT_STATE, TAG_EXPORTER = "alignflow.export_state", "alignflow.exporter"

log = logging.getLogger(__name__)


class ExportError(AlignflowError):
    """An export that cannot be written (already exported, nothing to export, the target refused it)."""


class NothingToExport(ExportError):
    """The run recorded no training metrics (it ended before either side trained)."""


@dataclass(frozen=True, slots=True)
class RunSeries:
    """What an export writes: the run's view, each side's per-step metrics (index step, one column each), the
    experiment configuration the run recorded and each side's host snapshot."""

    view: RunView
    sides: Mapping[str, pd.DataFrame]
    config: Mapping[str, Any] = field(default_factory=dict)  # the experiment as the run recorded it
    snapshots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # side label -> host snapshot

    @property
    def report_dir(self) -> Path | None:
        """The directory of the run's report (report.html, aligned.csv, ...), when it is on this machine."""
        if self.view.report is None:
            return None
        folder = Path(self.view.report).parent
        return folder if folder.is_dir() else None


def run_series(store: Any, run_id: str) -> RunSeries:
    """Both sides' recorded metrics of run `run_id` (a side whose training step never ran is left out)."""
    from alignflow.errors import RecordNotFound
    from alignflow.runview import run_view

    view = run_view(store, run_id)
    sides: dict[str, pd.DataFrame] = {}
    snapshots: dict[str, Mapping[str, Any]] = {}
    for label, side in SIDES.items():
        step, source = side.training, side.name
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
        if sv.host is not None and sv.host in view.snapshots:
            snapshots[label] = view.snapshots[sv.host]
    if not sides:
        raise NothingToExport(f"run {view.run_id}: no training metrics recorded (steps "
                              f"{', '.join(s.training for s in SIDES.values())} did not run); nothing to export")
    run = store.get_run(view.run_id)
    try:
        recorded = store.experiment_config(run.experiment, run.config_sha256)
    except RecordNotFound:
        recorded = {}
    config = recorded.get("experiment") if isinstance(recorded.get("experiment"), Mapping) else recorded
    return RunSeries(view, sides, dict(config or {}), snapshots)


def default_mlflow_uri(state: Path) -> str:
    """The local tracking store: SQLite under the state dir (`mlflow ui --backend-store-uri` opens it)."""
    return f"sqlite:///{(state / MLFLOW_DB).resolve()}"


def check_mlflow_uri(uri: str) -> str:
    """`uri` if MLflow 3 can track into it; a ConfigError naming the fix for what it refuses (file stores)."""
    if uri.startswith("file:") or "://" not in uri:
        raise ConfigError(f"--mlflow-uri {uri!r}: MLflow 3 keeps no file stores; give a database URI "
                          "(sqlite:///PATH/mlflow.db) or a tracking server (http://HOST:5000), or leave the option "
                          "out for the state dir's own store")
    return uri


def export_run(store: Any, run_id: str, *, tensorboard: str | Path | None = None, mlflow: str | None = None
               ) -> list[str]:
    """Export run `run_id` to the targets given; lines saying where it went and how to open it."""
    series = run_series(store, run_id)
    done: list[str] = []
    if tensorboard is not None:
        out = export_tensorboard(series, tensorboard)
        done.append(f"tensorboard: {out} (runs {', '.join(p.name for p in _tb_runs(out))}; "
                    f"open with: tensorboard --logdir {tensorboard})")
    if mlflow:
        runs = export_mlflow(series, mlflow)
        children = ", ".join(f"{side} {rid}" for side, rid in runs.items() if side != "run")
        done.append(f"mlflow: {mlflow}: run {runs['run']} (children {children})"
                    + (f"; open with: mlflow ui --backend-store-uri {mlflow}" if mlflow.startswith("sqlite:") else ""))
        if series.report_dir is None:
            done.append(f"mlflow: the report of run {series.view.run_id} is not on this machine "
                        f"({series.view.report or 'none recorded'}): no report artifacts")
    return done


# ---- TensorBoard --------------------------------------------------------------------------------------------

def export_tensorboard(series: RunSeries, log_dir: str | Path) -> Path:
    """Write the run under `<log_dir>/<run id>/`: one TensorBoard run per side and one of the error; returns the
    run's directory.

    Staged (`alignflow.staging.staged_dir`): the run's directory appears whole or not at all, whoever is killed
    when; a held Ctrl-C is taken between tags.
    """
    from tensorboard.summary import Writer

    from alignflow.staging import check_interrupted, staged_dir

    out = Path(log_dir) / series.view.run_id
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        out.rmdir()  # an empty directory (made by hand, or by an alignflow before staging) holds no export
    elif out.exists() or out.is_symlink():
        done = out.is_dir() and any(out.rglob("events.out.tfevents.*"))
        raise ExportError(f"{out}: run {series.view.run_id} was already exported there; remove it to export again"
                          if done else f"{out}: exists and is not an export of run {series.view.run_id}; remove it "
                          "or choose another log dir")
    metrics = _metric_order(series)
    with staged_dir(out, purpose="export tensorboard", refuse=ExportError) as tmp:
        for name, tags in _tb_series(series, metrics):
            writer = Writer(str(tmp / name))
            try:
                for tag, values in tags:
                    check_interrupted()
                    for step, value in values:
                        writer.add_scalar(tag, value, step)
                writer.flush()
            finally:
                writer.close()
    return out


def _tb_series(series: RunSeries, metrics: list[str]
               ) -> Iterator[tuple[str, list[tuple[str, list[tuple[int, float]]]]]]:
    """(TensorBoard run, [(tag, [(step, value)])]): each side's metrics under their own names, then the error."""
    for label, frame in series.sides.items():
        yield label, [(m, _finite(frame[m])) for m in metrics if m in frame.columns]
    if {TEST.label, REFERENCE.label} <= set(series.sides):
        test, ref = series.sides[TEST.label], series.sides[REFERENCE.label]
        both = [m for m in metrics if m in test.columns and m in ref.columns]
        yield ERROR_RUN, [(f"error/{m}", _finite((test[m] - ref[m]).dropna())) for m in both]


def _tb_runs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir())


def _finite(values: pd.Series) -> list[tuple[int, float]]:
    return [(int(step), float(v)) for step, v in values.items() if math.isfinite(v)]


# ---- MLflow -------------------------------------------------------------------------------------------------

def export_mlflow(series: RunSeries, tracking_uri: str) -> dict[str, str]:
    """Write the parent run and one child per side into `tracking_uri`; returns {"run": parent id, side: child id}.

    All or nothing (issue 33): every run is created tagged `alignflow.export_state=partial` with the exporting
    process's identity and one export id, and tagged `complete` together at the end; a failure or a held Ctrl-C
    before then deletes the runs it created, so a retry is not refused as already exported. What an exporter killed
    with SIGKILL left (a partial export whose process is dead, `alignflow.controller.liveness`) is deleted by the
    next export of that run; a partial export whose process lives, or runs on another host, is refused, never
    guessed about.

    MLflow's telemetry is off unless the environment asks for it (MLFLOW_DISABLE_TELEMETRY=false): left on, MLflow
    writes an installation id under ~/.config and posts usage records from every export (issue 40: nothing
    outside the state dir, no telemetry).
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read by mlflow.telemetry when it is imported
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from alignflow.staging import check_interrupted, committing

    view = series.view
    created: list[str] = []
    client = None
    if check_mlflow_uri(tracking_uri).startswith("sqlite:///"):  # SQLite creates the file, not its directory
        from alignflow.state import writable_dir

        writable_dir(Path(tracking_uri[len("sqlite:///"):]).parent)  # a read-only one: exit 2, naming it
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = _experiment(client, view.experiment, tracking_uri)
        done = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_RUN_ID}` = '{view.run_id}'")
        _refuse_earlier_exports(client, done, tracking_uri, view)
        started_ms = int(view.started.timestamp() * 1000)
        tags = {TAG_RUN_ID: view.run_id, "alignflow.experiment": view.experiment,
                "alignflow.verdict": view.verdict or "none", "alignflow.status": view.status,
                TAG_EXPORT_ID: uuid.uuid4().hex, TAG_EXPORT_RUNS: str(1 + len(series.sides)),
                TAG_EXPORT_STATE: "partial", TAG_EXPORTER: json.dumps(controller.current().to_dict())}
        parent = client.create_run(experiment_id, start_time=started_ms, run_name=view.run_id, tags={
            **tags, "mlflow.note.content": f"alignflow run {view.run_id} of {view.experiment}: verdict "
            f"{view.verdict or 'none'}; one child run per side (error = NPU - GPU)"}).info.run_id
        created.append(parent)
        _log(client, parent, _run_params(series), _run_metrics(series, started_ms))
        if series.report_dir is not None:
            client.log_artifacts(parent, str(series.report_dir), artifact_path="report")
        out = {"run": parent}
        for label, frame in series.sides.items():
            check_interrupted()
            child = client.create_run(experiment_id, start_time=started_ms, run_name=f"{view.run_id} {label}",
                                      tags={**tags, TAG_SIDE: label, TAG_PARENT: parent}).info.run_id
            created.append(child)
            metrics = [(str(m), step, v) for m in _metric_order(series) if m in frame.columns
                       for step, v in _finite(frame[m])]
            _log(client, child, _side_params(series, label), metrics, started_ms)
            client.set_terminated(child, status="FINISHED")
            out[label] = child
        with committing(f"mlflow: {tracking_uri}"):
            for rid in created:
                client.set_tag(rid, TAG_EXPORT_STATE, "complete")
            client.set_terminated(parent, status="FINISHED" if view.status == "completed" else "FAILED")
        return out
    except MlflowException as exc:
        _undo(client, created)
        raise ExportError(f"{tracking_uri}: MLflow refused the export: {exc.message}") from None
    except BaseException:
        _undo(client, created)
        raise


def _refuse_earlier_exports(client: Any, earlier: list[Any], tracking_uri: str, view: RunView) -> None:
    """Refuse a run exported before (or being exported now); delete the partial exports of dead exporters."""
    groups: dict[str, list[Any]] = {}
    for run in earlier:
        groups.setdefault(run.data.tags.get(TAG_EXPORT_ID, "before export ids"), []).append(run)
    kept: list[Any] = []
    for runs in groups.values():
        tags = runs[0].data.tags
        whole = all(r.data.tags.get(TAG_EXPORT_STATE, "complete") == "complete" for r in runs) and (
            TAG_EXPORT_RUNS not in tags or len(runs) >= int(tags[TAG_EXPORT_RUNS]))
        if whole:
            kept += runs
            continue
        try:
            identity: controller.ControllerIdentity | None = controller.ControllerIdentity.from_dict(
                json.loads(tags.get(TAG_EXPORTER, "")))
        except (ValueError, KeyError, TypeError):
            identity = None
        state = controller.liveness(identity) if identity is not None else "unknown"
        if state == "dead":
            _undo(client, [r.info.run_id for r in runs])
            log.info("%s: deleted the partial export of run %s left by %s (dead)", tracking_uri, view.run_id,
                     identity.describe() if identity else "?")
            continue
        who = identity.describe() if identity is not None else "an unknown exporter"
        raise ExportError(f"{tracking_uri}: run {view.run_id} is being exported to experiment {view.experiment!r} by "
                          f"{who} ({'running' if state == 'alive' else 'on another host'}; MLflow runs "
                          f"{', '.join(r.info.run_id for r in runs)}); wait for it, or delete those runs if it died")
    if kept:
        raise ExportError(f"{tracking_uri}: run {view.run_id} was already exported to experiment "
                          f"{view.experiment!r} (MLflow runs {', '.join(r.info.run_id for r in kept)})")


def _experiment(client: Any, name: str, uri: str) -> str:
    """The id of MLflow experiment `name`, created if missing (artifacts beside a SQLite store, not in the cwd)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage != "active":
            raise ExportError(f"{uri}: MLflow experiment {name!r} is deleted; restore it "
                              f"(mlflow experiments restore --experiment-id {found.experiment_id}) or remove it "
                              "for good (mlflow gc) before exporting")
        return str(found.experiment_id)
    location = None
    if uri.startswith("sqlite:///"):  # MLflow's own default would be ./mlruns of whatever directory this runs in
        location = (Path(uri[len("sqlite:///"):]).parent / "artifacts").resolve().as_uri()
    return str(client.create_experiment(name, artifact_location=location, tags={"alignflow.experiment": name}))


def _log(client: Any, run_id: str, params: Mapping[str, str], metrics: list[tuple[str, int, float]],
         timestamp_ms: int = 0) -> None:
    from mlflow.entities import Metric, Param

    from alignflow.staging import check_interrupted

    items = [Param(k, v[:MLFLOW_PARAM_CHARS]) for k, v in params.items()]
    for i in range(0, len(items), MLFLOW_PARAM_BATCH):
        check_interrupted()
        client.log_batch(run_id, params=items[i:i + MLFLOW_PARAM_BATCH])
    values = [Metric(key, value, timestamp_ms, step) for key, step, value in metrics]
    for i in range(0, len(values), MLFLOW_BATCH):
        check_interrupted()
        client.log_batch(run_id, metrics=values[i:i + MLFLOW_BATCH])


def _undo(client: Any, created: list[str]) -> None:
    """Delete the MLflow runs of a failed export (what failed first is the error to report, not this)."""
    for rid in reversed(created):
        with contextlib.suppress(Exception):
            client.delete_run(rid)


def _run_params(series: RunSeries) -> dict[str, str]:
    """What defines the run: training and model settings, the data and its fingerprint, the conversion, the
    criteria with their thresholds, the code version and every artifact's sha256."""
    view, cfg = series.view, series.config
    params = {"alignflow.run_id": view.run_id, "alignflow.code_version": view.code_version}
    for section in ("training", "model"):
        params.update(_flat(cfg.get(section), section))
    data = cfg.get("data")
    data = data if isinstance(data, Mapping) else {}
    params.update({f"data.{k}": str(data[k]) for k in ("path", "prefix") if data.get(k) is not None})
    params.update(_flat(cfg.get("conversion"), "conversion"))
    params.update({f"criterion.{i}": c.label for i, c in enumerate(view.criteria)})
    for s in view.steps:
        for name, ref in s.inputs.items():
            if isinstance(ref, Mapping) and ref.get("sha256"):
                params.setdefault(f"sha256.input.{name}", str(ref["sha256"]))
        for a in s.artifacts:
            params[f"sha256.{s.step}.{a.name}"] = a.sha256
    if "sha256.input.data" in params:
        params["data.sha256"] = params["sha256.input.data"]
    return params


def _run_metrics(series: RunSeries, timestamp_ms: int) -> list[tuple[str, int, float]]:
    """Each criterion's value and pass (1/0) at step 0, and the per-step error NPU - GPU of every metric."""
    out: list[tuple[str, int, float]] = []
    for c in series.view.criteria:
        key = criterion_key(c.label)
        if c.value is not None and math.isfinite(c.value):
            out.append((f"criterion/{key}", 0, float(c.value)))
        out.append((f"criterion_passed/{key}", 0, 1.0 if c.passed else 0.0))
    if {TEST.label, REFERENCE.label} <= set(series.sides):
        test, ref = series.sides[TEST.label], series.sides[REFERENCE.label]
        for m in _metric_order(series):
            if m in test.columns and m in ref.columns:
                out += [(f"error/{m}", step, v) for step, v in _finite((test[m] - ref[m]).dropna())]
    return out


def criterion_key(label: str) -> str:
    """An MLflow metric name for a criterion label: `|mean_rel(lm_loss, excluding step 2)| < 1%` ->
    `mean_rel lm_loss excluding step 2` (MLflow names allow letters, digits, _ - . : / and spaces)."""
    head = label.rsplit(" <", 1)[0]
    return re.sub(r"\s+", " ", re.sub(r"[^\w.\-:/ ]", " ", head)).strip()


def _side_params(series: RunSeries, label: str) -> dict[str, str]:
    """The side's training settings and the host it trained on: device, framework versions, host name."""
    step, section = SIDES[label].training, SIDES[label].name
    params = {"alignflow.run_id": series.view.run_id, "alignflow.side": label, "step": step}
    sv = series.view.step(step)
    if sv is not None and sv.host:
        params["host"] = sv.host
    params.update(_flat(series.config.get(section), section))
    snap = series.snapshots.get(label) or {}
    if snap.get("hostname"):
        params["hostname"] = str(snap["hostname"])
    from alignflow.runview import host_device

    if snap:
        params["device"] = host_device(snap)
    params.update({f"package.{k}": str(v) for k, v in (snap.get("packages") or {}).items() if v})
    return params


def _flat(data: Any, prefix: str) -> dict[str, str]:
    """`{"lr": 0.001, "moe": {"num_experts": 4}}` -> `{"training.lr": "0.001", "training.moe.num_experts": "4"}`;
    unset values (None, {}) left out."""
    if isinstance(data, Mapping):
        out: dict[str, str] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}"))
        return out
    if data is None or data == [] or data == "":
        return {}
    return {prefix: ",".join(map(str, data)) if isinstance(data, list | tuple) else str(data)}


def _metric_order(series: RunSeries) -> list[str]:
    from alignflow.logs.schema import column_order

    return column_order(sorted({str(c) for f in series.sides.values() for c in f.columns}))
