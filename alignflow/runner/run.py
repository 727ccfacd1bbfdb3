"""Run-level operations: start a run (recording everything needed to reproduce it), reopen it by id, walk the
pipeline, finish it, and describe it (`alignflow show`).

The Prefect flow composes these same functions with one task per step; `execute_pipeline` is the plain-Python
walk used where Prefect is not wanted (benchmarks, the core's own tests).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alignflow import pipeline
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Inventory
from alignflow.errors import AlignflowError, PipelineError, PreflightError
from alignflow.fingerprint import HashMemo
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.cache import alignflow_version
from alignflow.runner.engine import StepRunner
from alignflow.runner.session import (
    Events,
    RunOptions,
    StepOutcome,
    load_run_inputs,
    plan_for,
    prepare_data,
)

log = logging.getLogger(__name__)


def start_run(
    experiment_path: str | Path,
    hosts_path: str | Path,
    *,
    store: Any,
    state_dir: Path,
    options: RunOptions | None = None,
) -> str:
    """Validate the inputs, record the experiment and a new run, return the run id.

    With `options.reproduce_of`, the experiment and inventory are the ones recorded by that run (not the files
    as they are now) and every step is forced, so that the new run's fingerprints can be compared with the old.
    """
    options = options or RunOptions()
    if options.reproduce_of is not None:
        experiment, inventory, _, old = reopen(options.reproduce_of, store=store)
        experiment_path, hosts_path = old["experiment_path"], old["hosts_path"]
        options = RunOptions(parent=options.reproduce_of, trigger=options.trigger, reproduce_of=options.reproduce_of,
                             force=tuple(s.name for s in pipeline.STEPS if not s.optional))
    else:
        experiment, inventory = load_run_inputs(experiment_path, hosts_path)
    if options.parent is not None:
        store.get_run(options.parent)  # fail early on an unknown parent
    plan = plan_for(experiment, options)
    config = experiment.model_dump(mode="json")
    config_sha = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    store.ensure_experiment(experiment.name, config=config, config_sha256=config_sha)
    params = {
        "experiment_path": str(Path(experiment_path).resolve()),
        "hosts_path": str(Path(hosts_path).resolve()),
        "experiment": config,
        "inventory": inventory.model_dump(mode="json"),
        "options": options.to_dict(),
        "plan": {"steps": list(plan.steps), "forced": sorted(plan.forced)},
        "state_dir": str(state_dir),
    }
    run = store.create_run(experiment.name, parent_id=options.parent, trigger=options.trigger,
                           code_version=f"alignflow {alignflow_version()}", params=params)
    return str(run.id)


def reopen(run_id: str, *, store: Any) -> tuple[Experiment, Inventory, pipeline.Plan, dict[str, Any]]:
    """The experiment, inventory and plan exactly as recorded when the run started."""
    run = store.get_run(run_id)
    params = run.params
    experiment = Experiment.model_validate(params["experiment"]).model_copy(
        update={"source": params["experiment_path"]})
    inventory = Inventory.model_validate(params["inventory"]).model_copy(update={"source": params["hosts_path"]})
    plan = pipeline.Plan(steps=tuple(params["plan"]["steps"]), forced=frozenset(params["plan"]["forced"]))
    return experiment, inventory, plan, params


def open_runner(
    run_id: str, *, store: Any, state_dir: Path, transport_factory: Any, events: Events | None = None,
) -> StepRunner:
    experiment, inventory, plan, _ = reopen(run_id, store=store)
    return StepRunner(run_id=run_id, experiment=experiment, inventory=inventory, store=store, state_dir=state_dir,
                      forced=plan.forced, transport_factory=transport_factory, events=events)


def preflight_run(run_id: str, *, store: Any, state_dir: Path, events: Events | None = None) -> Any:
    """Preflight of a recorded run (its experiment and inventory as recorded), before any step: a mismatch raises
    `PreflightError` listing every difference, so the run fails with that list as its error and nothing runs.

    The report is kept beside the run's logs (`runs/<id>/preflight.json`) whatever the outcome.
    """
    from alignflow.preflight import check_experiment

    experiment, inventory, _, _ = reopen(run_id, store=store)
    if not experiment.preflight:
        (events or log.warning)(f"preflight: turned off by {experiment.source} (preflight: false); both sides' "
                                "settings were NOT compared")
        return None
    report = check_experiment(experiment, inventory=inventory)
    out = state_dir / "runs" / run_id / "preflight.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
    if not report.ok:
        raise PreflightError(f"{report.summary()}\nnothing was run; `alignflow preflight {experiment.source}` lists "
                             "every setting with its source", report=report)
    (events or log.info)(report.summary())
    return report


def data_artifact(runner: StepRunner) -> ArtifactRef:
    memo = HashMemo(runner.state_dir / "hashmemo.sqlite")
    try:
        return prepare_data(runner.experiment, memo=memo)
    finally:
        memo.close()


def parent_outcomes(store: Any, parent_id: str) -> dict[str, dict[str, ArtifactRef]]:
    """Artifacts of each step of a parent run that succeeded (ran or cached)."""
    found: dict[str, dict[str, ArtifactRef]] = {}
    for sr in store.steps(parent_id):
        if sr.status in ("ran", "cached"):
            found[sr.step] = {a.name: ArtifactRef.from_record(a) for a in store.artifacts(sr.id)}
    return found


def reusable_parent_steps(store: Any, run_id: str) -> dict[str, dict[str, ArtifactRef]]:
    """The steps of `run_id` that its parent run supplies instead of executing them (with their artifacts):
    empty unless the run was asked to reuse its parent; steps the run forces are never taken from the parent."""
    _, _, plan, params = reopen(run_id, store=store)
    parent_id = params["options"].get("parent")
    if not parent_id or not params["options"].get("reuse_parent"):
        return {}
    return {step: refs for step, refs in parent_outcomes(store, parent_id).items()
            if step in plan.steps and step not in plan.forced}


def inputs_for(step: str, available: Mapping[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    sdef = pipeline.step(step)
    missing = [n for n in sdef.inputs if n not in available]
    if missing:
        raise PipelineError(f"step {step} cannot run: no {', '.join(missing)} from an earlier step or the parent run")
    return {n: available[n] for n in sdef.inputs}


def run_step(runner: StepRunner, step: str, available: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Execute one step given every artifact produced so far."""
    inputs = inputs_for(step, available)
    if step == "compare":
        from alignflow.runner.compare_step import run_compare

        fps = {name: ref.sha256 for name, ref in available.items() if name in ("data", "bf16_ckpt", "megatron_ckpt")}
        return run_compare(runner, inputs, fingerprints=fps)
    if step == "early_gate":
        from alignflow.runner.gate import run_gate

        return run_gate(runner, inputs)
    return runner.execute(step, inputs)


def reuse_parent_step(runner: StepRunner, step: str, parent: Mapping[str, Mapping[str, ArtifactRef]]) -> StepOutcome:
    """Record a step as reused from the parent run (its artifacts re-verified on their hosts)."""
    refs = dict(parent[step])
    problems = runner.verify(refs.values())
    if problems:
        raise PipelineError(f"{step}: the parent run's " + "; ".join(problems) + "; re-run that step instead")
    prev = next(s for s in runner.store.steps(runner.store.get_run(runner.run_id).parent_id) if s.step == step
                and s.status in ("ran", "cached"))
    record = runner.store.record_cached_step(runner.run_id, step, host=prev.host, command=prev.command,
                                             cache_key=prev.cache_key, reused_from=prev.reused_from or prev.id,
                                             inputs=prev.inputs)
    runner.emit(f"{step}: reused from parent run")
    return StepOutcome(step, "cached", refs, record.id, prev.cache_key)


def finish(store: Any, run_id: str, outcomes: Mapping[str, StepOutcome], *, error: str | None = None,
           cancelled: bool = False) -> dict[str, Any]:
    """Close the run: status, verdict, report; steps that never ran are recorded as skipped."""
    _, _, plan, _ = reopen(run_id, store=store)
    recorded = {s.step for s in store.steps(run_id)}
    for name in pipeline.STEP_NAMES:
        if name not in recorded and (name in plan.steps or not pipeline.step(name).optional):
            store.skip_step(run_id, name, reason="not reached: an earlier step failed" if error else "not planned")
    compare = outcomes.get("compare")
    verdict = compare.verdict if compare is not None else None
    report = None
    if compare is not None and "report" in compare.artifacts:
        report = str(Path(compare.artifacts["report"].path) / "report.html")
    status = "cancelled" if cancelled else ("failed" if error else "completed")
    store.finish_run(run_id, status=status, verdict=verdict if not error else (verdict or "fail"), report=report,
                     error=error)
    return show(store, run_id)


def show(store: Any, run_id: str) -> dict[str, Any]:
    """The `alignflow show --json` object."""
    run = store.get_run(run_id)
    steps = []
    by_name = {s.step: s for s in store.steps(run.id)}
    for name in pipeline.STEP_NAMES:
        sr = by_name.get(name)
        if sr is None:
            continue
        steps.append({
            "step": sr.step, "host": sr.host, "status": sr.status, "cache_key": sr.cache_key,
            "exit_code": sr.exit_code, "started": _iso(sr.started_at), "finished": _iso(sr.finished_at),
            "error": sr.error,
            "artifacts": [{"name": a.name, "host": a.host, "path": a.path, "sha256": a.sha256, "size": a.size_bytes}
                          for a in store.artifacts(sr.id)],
        })
    return {"run_id": run.id, "experiment": run.experiment, "parent": run.parent_id, "status": run.status,
            "verdict": run.verdict, "report": run.report, "started": _iso(run.started_at),
            "finished": _iso(run.finished_at), "error": run.error, "steps": steps}


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def execute_pipeline(
    run_id: str, *, store: Any, state_dir: Path, transport_factory: Any, events: Events | None = None,
) -> dict[str, Any]:
    """Walk the run's plan step by step without Prefect (the flow does the same with tasks)."""
    runner = open_runner(run_id, store=store, state_dir=state_dir, transport_factory=transport_factory, events=events)
    outcomes: dict[str, StepOutcome] = {}
    try:
        preflight_run(run_id, store=store, state_dir=state_dir, events=events)
        _, _, plan, _ = reopen(run_id, store=store)
        parent = reusable_parent_steps(store, run_id)
        available: dict[str, ArtifactRef] = {"data": data_artifact(runner)}
        for name in plan.steps:
            outcome = (reuse_parent_step(runner, name, parent) if name in parent
                       else run_step(runner, name, available))
            outcomes[name] = outcome
            available.update(outcome.artifacts)
        return finish(store, run_id, outcomes)
    except AlignflowError as exc:
        return finish(store, run_id, outcomes, error=str(exc))
    finally:
        runner.close()
