"""The `compare` step: parse both training logs on the controller, judge them, write the report.

The test side is the NPU and the reference the GPU (per-step error = NPU - GPU, as in seed 000). The step is
cached like the others: same logs (by sha256), same criteria and same comparison code give the same verdict.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alignflow import pipeline
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.cache import cache_key
from alignflow.runner.engine import StepRunner
from alignflow.runner.session import CONTROLLER, StepOutcome, compare_code_version


def run_compare(runner: StepRunner, inputs: Mapping[str, ArtifactRef],
                fingerprints: Mapping[str, str] | None = None) -> StepOutcome:
    """Compare `npu_log` (test) with `gpu_log` (reference); record the comparison and the report."""
    from alignflow.compare import compare, write_report
    from alignflow.logs import parse_log

    experiment = runner.experiment
    criteria = [c.model_dump(mode="json") for c in experiment.criteria]
    key = cache_key(step="compare", argv=("compare", "npu_log", "gpu_log"),
                    files={"criteria.json": json.dumps(criteria, sort_keys=True)}, env={},
                    code_version=compare_code_version(),
                    inputs={"gpu_log": inputs["gpu_log"].sha256, "npu_log": inputs["npu_log"].sha256})
    host = runner.host("compare")
    transport = runner.transport(host)
    if "compare" not in runner.forced:
        cached = runner.store.find_cached_step("compare", key)
        previous = runner.store.comparison(cached.run_id) if cached is not None else None
        if previous is not None:
            outcome = runner._reuse("compare", key, cached)
            if outcome is not None:
                runner.store.add_comparison(runner.run_id, verdict=previous.verdict, criteria=previous.criteria,
                                            summary=previous.summary)
                return StepOutcome("compare", "cached", outcome.artifacts, outcome.step_run_id, key,
                                   verdict=previous.verdict)

    parsed: dict[str, Any] = {}
    for name in ("npu_log", "gpu_log"):
        ref = inputs[name]
        local = _local_log(runner, ref)
        parsed[name] = parse_log(local.read_text(encoding="utf-8", errors="replace").splitlines(),
                                 source=f"{ref.host}:{ref.path}")
    report_dir = runner.state_dir / "reports" / f"{runner.run_id}-{uuid.uuid4().hex[:6]}"
    step_run = runner.store.start_step(runner.run_id, "compare", host=host.name,
                                       command=f"compare npu_log={inputs['npu_log'].short()} "
                                               f"gpu_log={inputs['gpu_log'].short()}",
                                       cache_key=key, inputs={n: inputs[n].to_dict() for n in ("npu_log", "gpu_log")})
    try:
        comparison = compare(parsed["npu_log"], parsed["gpu_log"], experiment.criteria)
        files = write_report(comparison, report_dir, title=f"{experiment.name} — run {runner.run_id}",
                             labels=("NPU", "GPU"), fingerprints=dict(fingerprints or {}))
        result = comparison.to_json()
        runner.store.add_comparison(runner.run_id, verdict=result["verdict"], criteria=result["criteria"],
                                    summary=result)
        fp = transport.sha256([str(report_dir)])[str(report_dir)]
        ref = ArtifactRef("report", host.name if host.name else CONTROLLER, str(report_dir), fp.sha256, fp.size,
                          "report", [[f.path, f.sha256, f.size] for f in fp.files])
        runner.store.add_artifact(step_run.id, name="report", host=ref.host, path=ref.path, kind="report",
                                  sha256=ref.sha256, size_bytes=ref.size, manifest=ref.manifest)
        runner.store.finish_step(step_run.id, status="ran", exit_code=0, stdout_tail=str(files.html),
                                 stderr_tail="")
    except Exception as exc:
        runner.store.finish_step(step_run.id, status="failed", exit_code=None, stdout_tail="", stderr_tail="",
                                 error=str(exc))
        raise
    runner.emit(f"compare: verdict {result['verdict']} — report {files.html}")
    return StepOutcome("compare", "ran", {"report": ref}, step_run.id, key, verdict=result["verdict"])


def _local_log(runner: StepRunner, ref: ArtifactRef) -> Path:
    """A controller copy of the training log `ref`: the one the engine fetched when it checked the log in this
    run (`runs/<id>/logs/<step>.log`) when its bytes are the artifact's, else a fresh download."""
    from alignflow.fingerprint import Fingerprinter

    logs_dir = runner.state_dir / "runs" / runner.run_id / "logs"
    producer = pipeline.producer(ref.name)
    if producer is not None:
        checked = logs_dir / f"{producer.name}.log"
        if checked.is_file() and Fingerprinter().fingerprint(checked).sha256 == ref.sha256:
            return checked
    logs_dir.mkdir(parents=True, exist_ok=True)
    local = logs_dir / f"{ref.name}.log"
    runner.transport_by_name(ref.host).get(ref.path, str(local), overwrite=True)
    return local
