"""A side's training in a recorded run: its step record, its log on the controller, what the log says.

The matrix (`alignflow.runner.matrix`) and the goldens (`alignflow.runner.goldens`) both read a run's trainings the
same way: the NPU side is `npu_reload_train` (log `npu_log`), the GPU side `gpu_train` (log `gpu_log`); a
completed step's log is its recorded artifact, fetched from its host (a cached step's is the run's it was reused
from: the same bytes, the same sha256); a failed step's is what its job left (its log, else its stdout).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from alignflow import pipeline
from alignflow.errors import AlignflowError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.engine import StepRunner
from alignflow.store import Store
from alignflow.store.records import StepRunRecord, StepStatus

log = logging.getLogger(__name__)

SIDES = pipeline.SIDE_NAMES
SIDE_STEP: dict[str, pipeline.StepSpec] = {s.name: pipeline.known_step(s.training) for s in pipeline.SIDES}


@dataclass(frozen=True, slots=True)
class TrainingLog:
    """One side's training of a run: the step record (None: never started), its log text, the log's sha256 when
    it is the recorded artifact (a completed training)."""

    side: str
    record: StepRunRecord | None
    text: str
    sha256: str | None

    @property
    def completed(self) -> bool:
        return self.record is not None and self.record.status in (StepStatus.RAN, StepStatus.CACHED)

    @property
    def origin_step_run(self) -> str | None:
        """The step run that trained it (a cached step's `reused_from`)."""
        if self.record is None:
            return None
        return self.record.reused_from or self.record.id


def side_of(step: str) -> str | None:
    """`npu` / `gpu` for the two alignment trainings, None for any other step."""
    return next((side for side, spec in SIDE_STEP.items() if spec.name == step), None)


def training_log(store: Store, runner: StepRunner, run_id: str, side: str, *, local_dir: Path) -> TrainingLog:
    """Side `side`'s training of run `run_id`, its log fetched into `local_dir`."""
    spec = SIDE_STEP[side]
    records = [s for s in store.steps(run_id) if s.step == spec.name]
    record = records[-1] if records else None
    if record is None:
        return TrainingLog(side, None, "", None)
    log_name = next(o.artifact for o in spec.outputs if o.path == "train.log")
    local = local_dir / f"{run_id}-{side}.log"
    if record.status in (StepStatus.RAN, StepStatus.CACHED):
        refs = {a.name: ArtifactRef.from_record(a) for a in store.artifacts(record.id)}
        ref = refs.get(log_name)
        if ref is None:
            return TrainingLog(side, record, "", None)
        local.parent.mkdir(parents=True, exist_ok=True)
        runner.transport_by_name(ref.host).get(ref.path, str(local), overwrite=True)
        return TrainingLog(side, record, local.read_text(encoding="utf-8", errors="replace"), ref.sha256)
    handle = record.job_handle or {}
    if not record.host:
        return TrainingLog(side, record, "", None)
    try:
        transport = runner.transport_by_name(record.host)
        for path in (f"{handle['out']}/train.log" if handle.get("out") else None,
                     f"{handle['job_dir']}/stdout" if handle.get("job_dir") else None):
            if path and transport.exists(path):
                return TrainingLog(side, record, transport.read_text(path, max_bytes=16 << 20), None)
    except AlignflowError as exc:  # the host is gone: the step record's tails still tell how it ended
        log.warning("cannot read what step run %s left on %s: %s", record.id, record.host, exc)
    return TrainingLog(side, record, "", None)
