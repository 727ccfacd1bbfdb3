"""The `gate` executor: both sides train a few steps from the converted weights before the long trainings start.

Step 1 is a forward pass on the same batch from the same weights, before any update, so it must give the same lm
loss (and MTP loss) on both sides within 0.005% relative (docs/seeds.md#early-gate). A failing gate stops the
run hours before the long trainings would have shown the same thing: a GLU `linear_fc1` copied without its
de-interleave, or a transposed square expert matrix, converts without a single shape error, and only the numbers
show it.

Both gate trainings are the pipeline's own trainings (same backends, same renderers), `gate.steps` long, from
the checkpoint each side's long training loads (the bf16 MindFormers one and the converted Megatron one in the
classic pipeline; the same base for two Megatron sides). Their logs are held to the same rules as
the long trainings' (sentinels, required load lines); a metric that only one side reports fails the gate (a
MindSpore wrapper without `get_mtp_loss` logs no MTP loss).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from alignflow import pipeline
from alignflow.backends import render_training, side_backend
from alignflow.backends.commands import timeout_for, train_spec
from alignflow.backends.template import CommandTemplate
from alignflow.config.hosts import Host
from alignflow.errors import AlignflowError, PipelineError, RemoteJobError
from alignflow.pipeline import Side
from alignflow.runner.artifacts import ArtifactRef, declared_inputs
from alignflow.runner.cache import cache_key
from alignflow.runner.diagnose_step import describe, run_diagnose
from alignflow.runner.engine import StepRunner
from alignflow.runner.placeholders import fill_all
from alignflow.runner.recording import recording
from alignflow.runner.session import StepOutcome
from alignflow.store.records import StepStatus
from alignflow.transport import JobHandle, Transport

CAUSE = ("step 1 is a forward pass of the same batch through the same weights on both sides, before any update, "
         "so a difference here comes from the conversion (spec) or the model configuration, not from numerics; "
         "check the conversion spec's rules (a GLU linear_fc1 without de-interleave, a transposed square expert "
         "matrix converts without a shape error) and `alignflow preflight`")


class GateFailed(PipelineError):
    """Step-1 losses of the two sides differ beyond the gate's tolerance (or cannot be compared)."""


@dataclass(frozen=True, slots=True)
class _Side:
    name: Side
    host: Host
    load: str  # the input artifact the side loads
    template: CommandTemplate


@dataclass(frozen=True, slots=True)
class _Job:
    side: _Side
    transport: Transport
    handle: JobHandle
    out: str


def run_gate(runner: StepRunner, spec: pipeline.StepSpec, available: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Run (or reuse) the gate; raises `GateFailed` after recording the step as failed."""
    inputs = declared_inputs(spec, available)
    exp = runner.experiment
    gate = exp.gate
    sides = []
    for side in pipeline.SIDES:  # each on the host of its long training, from the checkpoint that training loads
        host = runner.host(side.training)
        load = runner.ctx.pipeline.load(side.name)
        train = train_spec(exp, spec.name, side.name, gate.steps, "{in:" + load + "}", None,
                           data_sha256=inputs["data"].sha256, host=host)
        sides.append(_Side(side.name, host, load, render_training(exp, train)))
    versions = [runner.code_version(side.template, side.host) for side in sides]
    key = cache_key(step=spec.name, argv=[a for s in sides for a in (*s.template.argv, "|")],
                    files={f"{s.name}/{k}": v for s in sides for k, v in s.template.files.items()},
                    env={f"{s.name}/{k}": v for s in sides for k, v in s.template.env.items()},
                    code_version="|".join(versions), inputs={n: ref.sha256 for n, ref in inputs.items()},
                    extra={"steps": gate.steps, "rel_tol": gate.rel_tol, "metrics": list(gate.metrics)})
    reused = runner.reused(spec.name, key)
    if reused is not None:
        return reused
    try:
        rows, outcome = _gate(runner, spec, sides, inputs, key)
    except GateFailed as exc:
        raise GateFailed(f"{exc}\n{_diagnose_after_failure(runner, available)}") from exc
    runner.emit(f"{spec.name}: passed (" + ", ".join(f"{r['metric']} rel {r['rel_diff']:.2e}" for r in rows) + ")")
    return outcome


def _gate(runner: StepRunner, spec: pipeline.StepSpec, sides: list[_Side], inputs: Mapping[str, ArtifactRef],
          key: str) -> tuple[list[dict[str, Any]], StepOutcome]:
    """Launch both sides, judge their step 1, record the gate; (rows, outcome), or `GateFailed` once recorded."""
    gate = runner.experiment.gate
    controller = runner.host(spec.name)
    jobs: list[_Job] = []
    with recording(runner.store, runner.run_id, spec.name, host=controller.name,
                   command=" | ".join(" ".join(s.template.argv) for s in sides), cache_key=key,
                   inputs=inputs) as rec:
        try:
            for side in sides:
                jobs.append(_launch(runner, spec, side, inputs))
            runner.attach(rec, [(job.transport, job.handle) for job in jobs])  # a cancelled run kills both
            results = {job.side.name: _step1(runner, spec, job, rec.id) for job in jobs}
        except BaseException:
            _cancel_running(jobs)  # a failed side (or an interrupted gate) must not leave the other side training
            raise
        rows, failed = _judge(results, gate.metrics, gate.rel_tol)
        report_dir = runner.state_dir / "runs" / runner.run_id / spec.name
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "gate.json").write_text(json.dumps({"rows": rows, "passed": not failed}, indent=2))
        fp = runner.transport(controller).sha256([str(report_dir)])[str(report_dir)]
        ref = ArtifactRef.from_fingerprint("gate_report", controller.name, str(report_dir), fp, "report")
        rec.add(ref)
        if failed:
            raise GateFailed("early gate failed — " + CAUSE + ":\n  " + "\n  ".join(failed))
        rec.ran(exit_code=0, stdout_tail=json.dumps(rows))
    return rows, StepOutcome(spec.name, StepStatus.RAN, {"gate_report": ref}, rec.id, key)


def _diagnose_after_failure(runner: StepRunner, available: Mapping[str, ArtifactRef]) -> str:
    """A failed gate is where a tensor-level diagnosis pays most: run it now (as the run's `diagnose` step)."""
    exp = runner.experiment
    if not exp.diagnose.on_gate_failure:
        return "diagnose: off (diagnose.on_gate_failure: false); `alignflow diagnose RUN` runs it"
    if any(side_backend(exp, s.name).dumps != "native" for s in pipeline.SIDES):
        return ("diagnose: the real frameworks dump through msprobe: `alignflow diagnose-setup` renders the setup, "
                "`alignflow diagnose-dumps` compares the dumps")
    try:
        outcome = run_diagnose(runner, runner.ctx.pipeline.step("diagnose"), available)
    except AlignflowError as exc:
        return f"diagnose: could not run ({exc})"
    report = outcome.artifacts["diagnosis"].path
    summary = runner.store.get_step(str(outcome.step_run_id)).stdout_tail or "{}"
    return f"diagnose: {describe(json.loads(summary))} ({report}/diagnosis.html)"


def _launch(runner: StepRunner, spec: pipeline.StepSpec, side: _Side, inputs: Mapping[str, ArtifactRef]) -> _Job:
    t = runner.transport(side.host)
    local = {"data": runner.stage(inputs["data"], side.host), side.load: runner.stage(inputs[side.load], side.host)}
    out = runner.out_dir(t, spec.name, f"{side.name}-{uuid.uuid4().hex[:12]}")
    values = {"python": t.python(), "out": out, **{f"in:{n}": p for n, p in local.items()}}
    handle = runner.launch(t, side.template, values, fill_all(side.template.argv, values), out=out,
                           name=f"{runner.run_id}-gate-{side.name}")  # one of the host's job slots, as every training
    runner.emit(f"{spec.name}: {side.name} side launched on {side.host.name} (job {handle.job_dir})")
    return _Job(side, t, handle, out)


def _step1(runner: StepRunner, spec: pipeline.StepSpec, job: _Job, step_run: str) -> dict[str, float]:
    """Wait for one side, then read its log exactly as the long trainings' logs are read; step 1's metrics."""
    side, t = job.side, job.transport
    state = runner.wait(f"{spec.name}/{side.name}", t, job.handle, timeout_for(runner.experiment, spec.name),
                        total=runner.experiment.gate.steps, log_format=side.template.log_format, step_run=step_run)
    if not state.ok:
        tail = t.tail(job.handle, 4096, stream="stderr").rstrip().splitlines()[-15:]
        raise RemoteJobError(f"{side.host.name}: early gate ({side.name} side) {state}; job dir "
                             f"{job.handle.job_dir}\n" + "\n".join("    " + line for line in tail),
                             handle=job.handle, state=state)
    remote = f"{job.handle.job_dir}/stdout" if side.template.log == "stdout" else f"{job.out}/{side.template.log}"
    parsed = runner.read_log(f"{spec.name} ({side.name} side)", t, remote, side.template,
                             f"{spec.name}-{side.name}")
    if 1 not in parsed.frame.index:
        raise GateFailed(f"{spec.name} ({side.name} side): the log has no step 1 ({remote})")
    row = parsed.frame.loc[1]
    return {k: float(v) for k, v in row.items() if isinstance(v, int | float) and v == v}


def _judge(results: Mapping[Side, Mapping[str, float]], metrics: list[str], rel_tol: float
           ) -> tuple[list[dict[str, Any]], list[str]]:
    """Step-1 relative difference of each metric; a metric on one side only is a failure, on neither is skipped."""
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    test, ref = pipeline.TEST, pipeline.REFERENCE
    for metric in metrics:
        t, r = results[test.name].get(metric), results[ref.name].get(metric)
        if t is None and r is None:
            continue
        if t is None or r is None:
            missing = test.label if t is None else ref.label
            failed.append(f"{metric}: the {missing} log has no step-1 {metric} (the other side logged "
                          f"{r if t is None else t:.6f})")
            continue
        rel = abs(t - r) / max(abs(r), 1e-12)
        ok = rel < rel_tol
        rows.append({"metric": metric, test.name: t, ref.name: r, "rel_diff": rel, "tolerance": rel_tol,
                     "passed": ok})
        if not ok:
            failed.append(f"{metric}: {test.label} {t:.6f} vs {ref.label} {r:.6f}, relative difference {rel:.3e} > "
                          f"{rel_tol:.1e}")
    if not rows and not failed:
        failed.append(f"no metric of {', '.join(metrics)} in either side's step-1 log")
    return rows, failed


def _cancel_running(jobs: list[_Job]) -> None:
    for job in jobs:
        try:
            if not job.transport.status(job.handle).finished:
                job.transport.cancel(job.handle)
        except AlignflowError:  # best effort: the failure being raised is the one to report
            continue
