"""The `compare` executor: parse both training logs on the controller, judge them, write the report.

The test side and the reference are the pipeline's (`alignflow.pipeline.SIDES`: per-step error = NPU - GPU). The step
is cached like the others: same logs (by sha256), same criteria and same comparison code give the same verdict.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from alignflow import pipeline
from alignflow.diagnose.noise import latest_noise_floor, resolve_criteria
from alignflow.fingerprint import Fingerprinter
from alignflow.runner.artifacts import ArtifactRef, declared_inputs
from alignflow.runner.cache import cache_key
from alignflow.runner.engine import StepRunner
from alignflow.runner.recording import recording
from alignflow.runner.session import StepOutcome, compare_code_version
from alignflow.runview import report_context, run_view, timing_conditions
from alignflow.store.records import StepStatus

LOGS = (pipeline.TEST.log, pipeline.REFERENCE.log)  # test, reference


def run_compare(runner: StepRunner, spec: pipeline.StepSpec, available: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Compare the test side's log with the reference's; record the comparison and the report.

    The report lists the fingerprint of every artifact the run has produced or reused so far (`available`).
    """
    inputs = declared_inputs(spec, available)
    experiment = runner.experiment
    # a threshold written as "3x noise" is 3 times the reference side's measured self-noise (`alignflow noise`)
    floor = latest_noise_floor(runner.store, experiment.name)
    criteria_used = resolve_criteria(experiment.criteria, floor)
    noise = {m: max(band.values()) for m, band in floor.band.items() if band} if floor is not None else None
    criteria = [c.model_dump(mode="json") for c in criteria_used]
    key = cache_key(step=spec.name, argv=("compare", *LOGS),
                    files={"criteria.json": json.dumps(criteria, sort_keys=True)}, env={},
                    code_version=compare_code_version(), inputs={n: inputs[n].sha256 for n in LOGS},
                    extra={"noise_floor": noise} if noise else None)
    host = runner.host(spec.name)
    if spec.name not in runner.forced:
        reused = _reuse(runner, spec.name, key)
        if reused is not None:
            return reused
    runner.require_executable(spec.name)
    # pandas and the report's writers: only when the step executes (a cached run reuses it without them)
    from alignflow.compare import compare, write_report
    from alignflow.logs.memory import memory_lines
    from alignflow.logs.parse import parse_log

    parsed, memory = {}, {}
    for name in LOGS:
        ref = inputs[name]
        lines = _local_log(runner, ref).read_text(encoding="utf-8", errors="replace").splitlines()
        parsed[name] = parse_log(lines, source=f"{ref.host}:{ref.path}")
        memory[name] = memory_lines(lines)  # every rank's report (a rank-prefixed log holds them all)
    report_dir = runner.state_dir / "reports" / f"{runner.run_id}-{uuid.uuid4().hex[:6]}"
    command = "compare " + " ".join(f"{name}={inputs[name].short()}" for name in LOGS)
    with recording(runner.store, runner.run_id, spec.name, host=host.name, command=command, cache_key=key,
                   inputs=inputs) as rec:
        comparison = compare(parsed[LOGS[0]], parsed[LOGS[1]], criteria_used, noise_floor=noise,
                             memory=(memory[LOGS[0]], memory[LOGS[1]]))
        view = run_view(runner.store, runner.run_id)
        context = report_context(view, description=experiment.description, writing=spec.name,
                                 generated_at=datetime.now(UTC), timing=timing_conditions(runner.store, view))
        files = write_report(comparison, report_dir, title=f"{experiment.name} — run {runner.run_id}",
                             labels=(pipeline.TEST.label, pipeline.REFERENCE.label),
                             fingerprints={n: ref.sha256 for n, ref in available.items()},
                             context=context)
        result = comparison.to_json()
        runner.store.add_comparison(runner.run_id, verdict=result["verdict"], criteria=result["criteria"],
                                    summary=result)
        fp = runner.transport(host).sha256([str(report_dir)])[str(report_dir)]
        ref = ArtifactRef.from_fingerprint("report", host.name, str(report_dir), fp, "report")
        rec.add(ref)
        rec.ran(exit_code=0, stdout_tail=str(files.html))
    runner.emit(f"compare: verdict {result['verdict']} — report {files.html}")
    return StepOutcome(spec.name, StepStatus.RAN, {"report": ref}, rec.id, key, verdict=result["verdict"])


def _reuse(runner: StepRunner, step: str, key: str) -> StepOutcome | None:
    """A cached comparison: the step run and its comparison record, both copied into this run."""
    cached = runner.cached_step(step, key)
    previous = runner.store.comparison(cached.run_id) if cached is not None else None
    if cached is None or previous is None:
        return None
    outcome = runner.reuse(step, key, cached)
    if outcome is None:
        return None
    runner.store.add_comparison(runner.run_id, verdict=previous.verdict, criteria=previous.criteria,
                                summary=previous.summary)
    return StepOutcome(step, StepStatus.CACHED, outcome.artifacts, outcome.step_run_id, key,
                       verdict=previous.verdict, reused_from_run=outcome.reused_from_run,
                       reused_from_step=outcome.reused_from_step)


def _local_log(runner: StepRunner, ref: ArtifactRef) -> Path:
    """A controller copy of the training log `ref` under the one name every run gives it, its producing step's
    (`runs/<id>/logs/npu_reload_train.log`, as the engine names the log it checks): that copy when its bytes are the
    artifact's, else a fresh download there (a log reused from an earlier run had been named `npu_log.log`)."""
    logs_dir = runner.state_dir / "runs" / runner.run_id / "logs"
    producer = runner.ctx.pipeline.producer(ref.name)
    local = logs_dir / f"{producer.name if producer is not None else ref.name}.log"
    if local.is_file() and Fingerprinter().fingerprint(local).sha256 == ref.sha256:
        return local
    logs_dir.mkdir(parents=True, exist_ok=True)
    runner.transport_by_name(ref.host).get(ref.path, str(local), overwrite=True)
    return local
