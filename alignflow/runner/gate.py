"""The early gate: both sides train a few steps from the converted weights before the long trainings start.

Seed 001 §6.4: the most reliable proof of a correct conversion is that step 1 — a forward pass on the same batch
from the same weights, before any update — gives the same lm loss (and MTP loss) on both sides, within 0.005%
relative. A failing gate stops the run hours before the long trainings would have shown the same thing: a GLU
`linear_fc1` copied without its de-interleave, or a transposed square expert matrix, converts without a single
shape error (seed 001 §10.2-10.3), and only the numbers show it.

Both gate trainings are the pipeline's own trainings (same backends, same renderers), `gate.steps` long, from
the bf16 checkpoint (NPU) and the converted Megatron checkpoint (GPU). Their logs are held to the same rules as
the long trainings' (sentinels, required load lines); a metric that only one side reports fails the gate (seed
001 §10.6: a MindSpore wrapper without `get_mtp_loss` logs no MTP loss).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from alignflow.backends import CommandTemplate, Side, TrainSpec, render_training
from alignflow.config.hosts import Host
from alignflow.errors import AlignflowError, PipelineError, RemoteJobError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.cache import cache_key
from alignflow.runner.commands import data_placeholder, timeout_for
from alignflow.runner.control import attach_jobs
from alignflow.runner.engine import StepRunner
from alignflow.runner.placeholders import fill_all
from alignflow.runner.session import StepOutcome

STEP = "early_gate"
CAUSE = ("step 1 is a forward pass of the same batch through the same weights on both sides, before any update, "
         "so a difference here comes from the conversion (spec) or the model configuration, not from numerics; "
         "check the conversion spec's rules (a GLU linear_fc1 without de-interleave, a transposed square expert "
         "matrix converts without a shape error) and `alignflow preflight`")


class GateFailed(PipelineError):
    """Step-1 losses of the two sides differ beyond the gate's tolerance (or cannot be compared)."""


@dataclass(frozen=True, slots=True)
class _Side:
    name: str  # npu | gpu
    host: Host
    load: str  # the input artifact the side loads
    template: CommandTemplate


@dataclass(frozen=True, slots=True)
class _Job:
    side: _Side
    transport: Any
    handle: Any
    out: str


def run_gate(runner: StepRunner, inputs: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Run (or reuse) the gate; raises `GateFailed` after recording the step as failed."""
    exp = runner.experiment
    gate = exp.gate
    data = inputs["data"]
    sides = []
    plan: tuple[tuple[Side, str, str], ...] = (("npu", "npu_reload_train", "bf16_ckpt"),
                                               ("gpu", "gpu_train", "megatron_ckpt"))
    for name, step, load in plan:
        spec = TrainSpec(STEP, name, gate.steps, data_placeholder(exp), data.sha256, "{in:" + load + "}", None)
        sides.append(_Side(name, runner.host(step), load, render_training(exp, spec)))
    versions = [runner.code_version(side.template, side.host) for side in sides]
    key = cache_key(step=STEP, argv=[a for s in sides for a in (*s.template.argv, "|")],
                    files={f"{s.name}/{k}": v for s in sides for k, v in s.template.files.items()},
                    env={f"{s.name}/{k}": v for s in sides for k, v in s.template.env.items()},
                    code_version="|".join(versions), inputs={n: inputs[n].sha256 for n in ("data", "bf16_ckpt",
                                                                                            "megatron_ckpt")},
                    extra={"steps": gate.steps, "rel_tol": gate.rel_tol, "metrics": list(gate.metrics)})
    controller = runner.host(STEP)
    if STEP not in runner.forced:
        reused = runner._reuse(STEP, key)
        if reused is not None:
            return reused
    step_run = runner.store.start_step(runner.run_id, STEP, host=controller.name,
                                       command=" | ".join(" ".join(s.template.argv) for s in sides),
                                       cache_key=key, inputs={n: inputs[n].to_dict() for n in inputs})
    jobs: list[_Job] = []
    try:
        for side in sides:
            jobs.append(_launch(runner, side, inputs))
        attach_jobs(runner.store, step_run.id, [job.handle for job in jobs])  # a cancelled run kills both
        results = {job.side.name: _step1(runner, job) for job in jobs}
        rows, failed = _judge(results, gate.metrics, gate.rel_tol)
        report_dir = runner.state_dir / "runs" / runner.run_id / STEP
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "gate.json").write_text(json.dumps({"rows": rows, "passed": not failed}, indent=2))
        fp = runner.transport(controller).sha256([str(report_dir)])[str(report_dir)]
        ref = ArtifactRef("gate_report", controller.name, str(report_dir), fp.sha256, fp.size, "report")
        runner.store.add_artifact(step_run.id, name=ref.name, host=ref.host, path=ref.path, kind=ref.kind,
                                  sha256=ref.sha256, size_bytes=ref.size)
        if failed:
            raise GateFailed("early gate failed — " + CAUSE + ":\n  " + "\n  ".join(failed))
        runner.store.finish_step(step_run.id, status="ran", exit_code=0, stdout_tail=json.dumps(rows),
                                 stderr_tail="")
        runner.emit(f"{STEP}: passed (" + ", ".join(f"{r['metric']} rel {r['rel_diff']:.2e}" for r in rows) + ")")
        return StepOutcome(STEP, "ran", {"gate_report": ref}, step_run.id, key)
    except BaseException as exc:
        _cancel_running(jobs)
        if not getattr(exc, "retryable", False):
            runner.store.finish_step(step_run.id, status="failed", exit_code=None, stdout_tail="", stderr_tail="",
                                     error=str(exc) if isinstance(exc, AlignflowError) else repr(exc))
        raise


def _launch(runner: StepRunner, side: _Side, inputs: Mapping[str, ArtifactRef]) -> _Job:
    t = runner.transport(side.host)
    local = {"data": runner.stage(inputs["data"], side.host), side.load: runner.stage(inputs[side.load], side.host)}
    out = str(t.path(f"artifacts/{STEP}/{side.name}-{uuid.uuid4().hex[:12]}"))
    values = {"python": t.python(), "out": out, **{f"in:{n}": p for n, p in local.items()}}
    handle = runner.launch(t, side.template, values, fill_all(side.template.argv, values), out=out,
                           name=f"{runner.run_id}-gate-{side.name}")  # one of the host's job slots, as every training
    runner.emit(f"{STEP}: {side.name} side launched on {side.host.name} (job {handle.job_dir})")
    return _Job(side, t, handle, out)


def _step1(runner: StepRunner, job: _Job) -> dict[str, float]:
    """Wait for one side, then read its log exactly as the long trainings' logs are read; step 1's metrics."""
    side, t = job.side, job.transport
    state = runner._wait(f"{STEP}/{side.name}", t, job.handle, timeout_for(runner.experiment, STEP))
    if not state.ok:
        tail = t.tail(job.handle, 4096, stream="stderr").rstrip().splitlines()[-15:]
        raise RemoteJobError(f"{side.host.name}: early gate ({side.name} side) {state}; job dir "
                             f"{job.handle.job_dir}\n" + "\n".join("    " + line for line in tail),
                             handle=job.handle, state=state)
    remote = f"{job.handle.job_dir}/stdout" if side.template.log == "stdout" else f"{job.out}/{side.template.log}"
    parsed = runner.read_log(f"{STEP} ({side.name} side)", t, remote, side.template, f"{STEP}-{side.name}")
    if 1 not in parsed.frame.index:
        raise GateFailed(f"{STEP} ({side.name} side): the log has no step 1 ({remote})")
    row = parsed.frame.loc[1]
    return {k: float(v) for k, v in row.items() if isinstance(v, int | float) and v == v}


def _judge(results: Mapping[str, Mapping[str, float]], metrics: list[str], rel_tol: float
           ) -> tuple[list[dict[str, Any]], list[str]]:
    """Step-1 relative difference of each metric; a metric on one side only is a failure, on neither is skipped."""
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for metric in metrics:
        npu, gpu = results["npu"].get(metric), results["gpu"].get(metric)
        if npu is None and gpu is None:
            continue
        if npu is None or gpu is None:
            missing = "NPU" if npu is None else "GPU"
            failed.append(f"{metric}: the {missing} log has no step-1 {metric} (the other side logged "
                          f"{gpu if npu is None else npu:.6f})")
            continue
        rel = abs(npu - gpu) / max(abs(gpu), 1e-12)
        ok = rel < rel_tol
        rows.append({"metric": metric, "npu": npu, "gpu": gpu, "rel_diff": rel, "tolerance": rel_tol, "passed": ok})
        if not ok:
            failed.append(f"{metric}: NPU {npu:.6f} vs GPU {gpu:.6f}, relative difference {rel:.3e} > {rel_tol:.1e}")
    if not rows and not failed:
        failed.append(f"no metric of {', '.join(metrics)} in either side's step-1 log")
    return rows, failed


def _cancel_running(jobs: list[_Job]) -> None:
    """A failed side (or an interrupted gate) must not leave the other side training."""
    for job in jobs:
        try:
            if not job.transport.status(job.handle).finished:
                job.transport.cancel(job.handle)
        except AlignflowError:  # best effort: the failure being raised is the one to report
            continue
