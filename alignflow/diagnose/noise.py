"""The noise floor: how far the reference side disagrees with itself, run to run, statistic by statistic.

The MindFormers migration guide's rule: a difference between the two stacks only means something against the
baseline's own run-to-run noise. `measure_noise` trains the reference (GPU) side N times from the same converted
checkpoint with determinism off (on a CPU the kernels may be deterministic anyway: the floor is then the logs'
printed resolution), parses each log, and takes, for every metric and statistic of the acceptance criteria, the
largest |statistic| of any run against the first. A criterion written `threshold: "3x noise"` resolves to 3 times
that (never below one unit of the printed resolution).

Recorded in the store as a run of the experiment with trigger `noise`: each training a step run with its metrics
(`noise_run_<i>`), the per-step band (`noise_band`: per metric, the largest |run_i - run_1| at each step — what
the report draws as the band around zero error) and the floor as the run's comparison summary (`verdict: noise`).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignflow.backends import TrainSpec, render_training
from alignflow.config.criteria import Criterion
from alignflow.config.experiment import Experiment
from alignflow.config.statistics import STATISTICS
from alignflow.errors import ConfigError, PipelineError, RemoteJobError
from alignflow.logs.schema import ParsedLog
from alignflow.pipeline import REFERENCE
from alignflow.store.params import NoiseRunParams
from alignflow.transport import JobSpec, Transport

TRIGGER = "noise"
BAND_SOURCE = "noise_band"


@dataclass(frozen=True, slots=True)
class NoiseFloor:
    """Each metric's self-noise per statistic, the per-step band, and each metric's printed resolution."""

    experiment: str
    runs: int
    statistics: dict[str, dict[str, float]]  # metric -> statistic -> max |value| over runs vs run 1
    band: dict[str, dict[int, float]]  # metric -> step -> max |run_i - run_1|
    resolution: dict[str, float] = field(default_factory=dict)  # metric -> one printed unit at its magnitude
    run_id: str | None = None

    def threshold(self, metric: str, statistic: str, multiple: float) -> float | None:
        value = self.statistics.get(metric, {}).get(statistic)
        if value is None:
            return None
        floor = max(value, self.resolution.get(metric, 0.0))
        return multiple * floor if floor > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "runs": self.runs, "statistics": self.statistics,
                "band": {m: {str(s): v for s, v in b.items()} for m, b in self.band.items()},
                "resolution": self.resolution, "run_id": self.run_id}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoiseFloor:
        return cls(str(data["experiment"]), int(data["runs"]), dict(data["statistics"]),
                   {m: {int(s): float(v) for s, v in b.items()} for m, b in data["band"].items()},
                   dict(data.get("resolution", {})), data.get("run_id"))


def noise_floor(experiment: str, logs: Sequence[ParsedLog]) -> NoiseFloor:
    """The floor of N parsed logs of the same training (pure)."""
    import numpy as np  # a cached run reads the recorded floor without it (issue 40)

    from alignflow.compare.comparison import comparable_metrics
    from alignflow.compare.statistics import error_statistics, paired, values_at

    if len(logs) < 2:
        raise ConfigError("a noise floor needs at least 2 runs")
    first = logs[0]
    metrics = [m for m in comparable_metrics(first) if all(m in log.frame.columns for log in logs[1:])]
    stats: dict[str, dict[str, float]] = {}
    band: dict[str, dict[int, float]] = {}
    resolution: dict[str, float] = {}
    for m in metrics:
        ref = first.frame[m].to_numpy(dtype=float, na_value=np.nan)
        steps = first.frame.index.to_numpy(dtype=np.int64)
        per: dict[str, float] = dict.fromkeys(STATISTICS, 0.0)
        widths: dict[int, float] = {}
        for log in logs[1:]:
            vals = log.frame[m].to_numpy(dtype=float, na_value=np.nan)
            pairs = paired(log.frame.index.to_numpy(dtype=np.int64), vals, steps, ref)
            es = error_statistics(pairs)
            for s, stat in STATISTICS.items():
                value = (max(values_at(pairs, stat, [1]).values(), default=0.0) if stat.reduce == "at_steps"
                         else es.get(s))
                if math.isfinite(value):
                    per[s] = max(per[s], abs(value))
            for step, e in zip(pairs.steps.tolist(), np.abs(pairs.error).tolist(), strict=True):
                widths[int(step)] = max(widths.get(int(step), 0.0), float(e))
        stats[m], band[m] = per, widths
        res = first.resolution.get(m)
        finite = ref[np.isfinite(ref)]
        if res is not None and finite.size:
            resolution[m] = float(res.quantum(float(np.median(np.abs(finite)))))
    return NoiseFloor(experiment, len(logs), stats, band, resolution)


def resolve_criteria(criteria: Sequence[Criterion], floor: NoiseFloor | None) -> list[Criterion]:
    """Criteria with every 'Nx noise' threshold replaced by N times the measured floor; without a floor (or
    without the metric in it) they stay unresolved, which fails them — never a silent pass."""
    out = []
    for c in criteria:
        if c.noise_multiple is None or floor is None:
            out.append(c)
            continue
        value = floor.threshold(c.metric, c.statistic, c.noise_multiple)
        out.append(c.model_copy(update={"threshold": value}) if value is not None else c)
    return out


def measure_noise(experiment: Experiment, *, transport: Transport, checkpoint: str, data: str, data_sha256: str,
                  runs: int, work_dir: Path, poll_s: float = 0.5, timeout_s: float | None = 6 * 3600.0
                  ) -> tuple[NoiseFloor, list[ParsedLog]]:
    """Train the reference side `runs` times (determinism off) from `checkpoint` on `transport`'s host; the floor."""
    from alignflow.diagnose.core import fill_placeholders
    from alignflow.logs import parse_log

    if runs < 2:
        raise ConfigError("--runs must be at least 2")
    loose = experiment.model_copy(update={"training": experiment.training.model_copy(update={"deterministic": False})})
    data_arg = "{in:data}" + (f"/{experiment.data.prefix}" if experiment.data.prefix else "")
    template = render_training(loose, TrainSpec(TRIGGER, REFERENCE.name, experiment.training.steps, data_arg,
                                                data_sha256, "{in:checkpoint}", None))
    values = {"python": transport.python(), "in:data": data, "in:checkpoint": checkpoint}
    launched = []
    for i in range(runs):  # one after the other: concurrent runs would contend for the same accelerator
        out = str(transport.path(f"artifacts/{TRIGGER}/run{i + 1}-{uuid.uuid4().hex[:8]}"))
        fill = {**values, "out": out}
        transport.mkdir(out)
        for rel, text in template.files.items():
            transport.write_text(f"{out}/{rel}", fill_placeholders(text, fill))
        argv = [fill_placeholders(a, fill) for a in template.argv]
        env = {k: fill_placeholders(v, fill) for k, v in template.env.items()}
        handle = transport.launch(JobSpec(argv, name=f"{TRIGGER}-{i + 1}", env=env, cwd=out, take_slot=True))
        state = transport.wait(handle, poll_s=poll_s, timeout_s=timeout_s)
        if not state.ok:
            tail = transport.tail(handle, 4096, stream="stderr").rstrip().splitlines()[-10:]
            raise RemoteJobError(f"{transport.host.name}: noise run {i + 1} {state}; job dir {handle.job_dir}\n"
                                 + "\n".join(tail), handle=handle, state=state)
        remote = f"{handle.job_dir}/stdout" if template.log == "stdout" else f"{out}/{template.log}"
        local = work_dir / f"run{i + 1}.log"
        local.parent.mkdir(parents=True, exist_ok=True)
        transport.get(remote, str(local), overwrite=True)
        launched.append(parse_log(local.read_text(encoding="utf-8", errors="replace").splitlines(),
                                  fmt=template.log_format, source=str(local)))
    return noise_floor(experiment.name, launched), launched


def record_noise(store: Any, experiment: Experiment, floor: NoiseFloor, logs: Sequence[ParsedLog]) -> NoiseFloor:
    """Record the noise runs and their floor as a run of the experiment (trigger `noise`)."""
    import hashlib

    import pandas as pd

    from alignflow import __version__

    config = experiment.model_dump(mode="json")
    sha = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    store.ensure_experiment(experiment.name, config=config, config_sha256=sha)
    run = store.create_run(experiment.name, trigger=TRIGGER, code_version=f"alignflow {__version__}",
                           params=NoiseRunParams(runs=floor.runs))
    try:
        for i, log in enumerate(logs):
            step = store.start_step(run.id, f"noise_train_{i + 1}", host=REFERENCE.name, command=log.source,
                                    cache_key="-",
                                    inputs={})
            store.add_metrics(run.id, source=f"noise_run_{i + 1}", frame=log.frame.select_dtypes("number"),
                              step_run_id=step.id)
            store.finish_step(step.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
        band = pd.DataFrame({m: pd.Series(b, dtype="float64") for m, b in floor.band.items()})
        band.index = band.index.astype("int64")
        store.add_metrics(run.id, source=BAND_SOURCE, frame=band)
        recorded = NoiseFloor(floor.experiment, floor.runs, floor.statistics, floor.band, floor.resolution, run.id)
        store.add_comparison(run.id, verdict=TRIGGER, criteria=[], summary=recorded.to_json())
        store.finish_run(run.id, status="completed", verdict=TRIGGER)
    except BaseException:
        store.finish_run(run.id, status="failed", error="recording the noise floor failed")
        raise
    return recorded


def latest_noise_floor(store: Any, experiment: str) -> NoiseFloor | None:
    """The newest recorded floor of an experiment (None when none was measured)."""
    for run in store.list_runs(experiment=experiment, limit=200):
        if run.trigger == TRIGGER and run.verdict == TRIGGER:
            record = store.comparison(run.id)
            if record is not None:
                return NoiseFloor.from_json(record.summary)
    return None


def noise_for_run(store: Any, experiment: Experiment, run_id: str, *, runs: int, work_dir: Path) -> NoiseFloor:
    """Measure and record the floor on the reference side's host of a run, from the checkpoint that side's training
    loaded in that run and its data."""
    from alignflow.backends import pipeline_for
    from alignflow.transport import open_transport

    run = store.get_run(run_id)
    inventory = run.alignment_params().inventory
    training, load = REFERENCE.training, pipeline_for(experiment).load(REFERENCE.name)
    trained = next((s for s in store.steps(run.id) if s.step == training and s.host), None)
    if trained is None or load not in (trained.inputs or {}):
        raise PipelineError(f"run {run.id}: no {training} with its {load} recorded")
    data = (trained.inputs or {}).get("data") or {}
    ckpt = trained.inputs[load]
    if ckpt.get("host") != trained.host or data.get("host") != trained.host:
        raise PipelineError(f"run {run.id}: the checkpoint and data are not on {trained.host}; noise runs where "
                            f"{training} ran")
    with open_transport(inventory.get(str(trained.host))) as t:
        floor, logs = measure_noise(experiment, transport=t, checkpoint=str(ckpt["path"]), data=str(data["path"]),
                                    data_sha256=str(data["sha256"]), runs=runs, work_dir=work_dir / run.id)
    return record_noise(store, experiment, floor, logs)


