"""The `diagnose` executor: both sides re-run one training step from the converted weights with tensor dumps,
compared module by module through the conversion spec (`alignflow.diagnose`).

It runs when a run asks for it (`alignflow diagnose RUN` is a run of this one step, reusing RUN's checkpoints)
and automatically when the early gate fails. Each side runs on the host of its long training; the dumps, the
diagnosis JSON and its HTML page are the step's `diagnosis` artifact on the controller. A divergence is the
step's verdict (`diverged`), not a failure of the step.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from alignflow import pipeline
from alignflow.backends.commands import timeout_for
from alignflow.codeversion import code_version_for
from alignflow.config.experiment import Experiment
from alignflow.runner.artifacts import ArtifactRef, declared_inputs
from alignflow.runner.cache import cache_key
from alignflow.runner.engine import StepRunner
from alignflow.runner.recording import recording
from alignflow.runner.session import StepOutcome
from alignflow.store.records import StepStatus


def chosen_step(experiment: Experiment) -> tuple[int, str]:
    """The step the diagnosis re-runs, and why: `diagnose.step` when set, else the first step whose update has a
    learning rate above 0 (a warm-up from 0 makes step 1's update zero on both sides: optimizer differences cannot
    show there; issue 47)."""
    if experiment.diagnose.step is not None:
        return experiment.diagnose.step, "the experiment's diagnose.step"
    from alignflow.twin.schedule import LRSchedule  # Megatron's schedule, which both sides follow

    t = experiment.training
    schedule = LRSchedule(max_lr=t.lr, min_lr=t.min_lr, warmup_steps=t.lr_warmup_iters,
                          decay_steps=t.lr_decay_iters or t.steps, style=t.lr_decay_style)
    for step in range(1, t.steps + 1):
        lr = schedule(step - 1)  # update k uses the rate after k - 1 updates
        if lr > 0:
            zero = {1: "", 2: "; step 1 has lr 0 in the warm-up"}.get(
                step, f"; steps 1-{step - 1} have lr 0 in the warm-up")
            return step, f"the first step where the optimizer acts (lr {lr:.3g}{zero})"
    return 1, "every step has lr 0"


def run_diagnose(runner: StepRunner, spec: pipeline.StepSpec, available: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Run (or reuse) the diagnosis of `experiment.diagnose.step`; its verdict is `pass` or `diverged`."""
    inputs = declared_inputs(spec, available)
    exp = runner.experiment
    settings = exp.diagnose
    step, _ = chosen_step(exp)
    # each side on the host of its long training, from the checkpoint that training loads
    hosts = {side.name: runner.host(side.training) for side in pipeline.SIDES}
    loads = {side.name: runner.ctx.pipeline.load(side.name) for side in pipeline.SIDES}
    recipe = exp.model_dump(mode="json", include={"model", "training", *pipeline.SIDE_NAMES, "conversion", "data"})
    key = cache_key(step=spec.name, argv=("diagnose", str(step)), files={}, env={},
                    code_version=code_version_for(("diagnose", "twin", "convert", "backends", "frameworks")),
                    inputs={n: ref.sha256 for n, ref in inputs.items()},
                    extra={"budget": settings.dump_budget_bytes, "recipe": recipe,
                           "hosts": {s: h.name for s, h in hosts.items()}})
    reused = runner.reused(spec.name, key)
    if reused is not None:
        return reused
    # numpy and the dump readers: imported by a run that diagnoses, not by one that reuses the diagnosis (issue 40)
    from alignflow.diagnose.core import Checkpoints, DataRef, run_diagnosis

    controller = runner.host(spec.name)
    out_dir = runner.state_dir / "runs" / runner.run_id / f"diagnose-{uuid.uuid4().hex[:8]}"
    with recording(runner.store, runner.run_id, spec.name, host=controller.name,
                   command=f"diagnose step {step} on " + " and ".join(h.name for h in hosts.values()),
                   cache_key=key, inputs=inputs) as rec:
        checkpoints = Checkpoints(**{side: runner.stage(inputs[loads[side]], host) for side, host in hosts.items()})
        data = DataRef(**{side: runner.stage(inputs["data"], host) for side, host in hosts.items()},
                       sha256=inputs["data"].sha256)
        runner.emit(f"{spec.name}: re-running step {step} on both sides with tensor dumps")
        result = run_diagnosis(exp, checkpoints=checkpoints, data=data,
                               transport={side: runner.transport(h) for side, h in hosts.items()}, out_dir=out_dir,
                               step=step, budget_bytes=settings.dump_budget_bytes, poll_s=runner.poll_s,
                               timeout_s=timeout_for(exp, spec.name),
                               on_launch=lambda handles: rec.attach(handles))
        fp = runner.transport(controller).sha256([str(out_dir)])[str(out_dir)]
        ref = ArtifactRef.from_fingerprint("diagnosis", controller.name, str(out_dir), fp, "report")
        rec.add(ref)
        summary = result.diagnosis.to_json()
        rec.ran(exit_code=0, stdout_tail=json.dumps({"verdict": summary["verdict"], "cause": summary["cause"]}))
    runner.emit(f"{spec.name}: {describe(result.diagnosis.to_json())} — {result.html_path}")
    return StepOutcome(spec.name, StepStatus.RAN, {"diagnosis": ref}, rec.id, key, verdict=result.diagnosis.verdict)


def describe(diagnosis: Mapping[str, object]) -> str:
    """One line: `pass`, or where and why the sides diverge."""
    cause = diagnosis.get("cause")
    if not isinstance(cause, Mapping):
        return f"step {diagnosis.get('step')} agrees module by module"
    return f"diverged at {cause.get('module')} ({cause.get('kind')}): {cause.get('summary')}"

