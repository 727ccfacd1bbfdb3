"""The alignment flow: preflight, then the pipeline steps as Prefect tasks; gpu_train and npu_reload_train run
concurrently.

No `from __future__ import annotations` here: Prefect builds the UI form from the real annotations
(orchestration reference G4).
"""

import logging
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.futures import PrefectFuture

from alignflow import pipeline
from alignflow.errors import AlignflowError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.run import reopen, reusable_parent_steps, reuse_parent_step
from flows.artifacts import publish_run_artifacts
from flows.hooks import kill_remote_jobs, remember_run
from tasks.context import open_store, runner_for
from tasks.steps import data_task, finish_task, preflight_task, start_run_task, step_task

log = logging.getLogger(__name__)
CONCURRENT = ("gpu_train", "npu_reload_train")


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    name = Path(str(params.get("experiment", "experiment"))).stem
    extra = f"-rerun-{params['force'][0]}" if params.get("parent_run") and params.get("force") else ""
    return f"align-{name}{extra}"


def _reuse_from_parent(run_id: str, step: str, parent: dict[str, dict[str, ArtifactRef]]) -> dict[str, Any] | None:
    """The step taken from the parent run (see `reusable_parent_steps`), or None when it must execute."""
    if step not in parent:
        return None
    with runner_for(run_id) as runner:
        return reuse_parent_step(runner, step, parent).to_dict()


@flow(
    name="alignment",
    flow_run_name=_flow_run_name,
    on_cancellation=[kill_remote_jobs],
    on_crashed=[kill_remote_jobs],
    log_prints=True,
)
def alignment(
    experiment: str,
    hosts: str = "hosts.yaml",
    from_step: str | None = None,
    only: list[str] | None = None,
    force: list[str] | None = None,
    parent_run: str | None = None,
    reuse_parent: bool = False,
    reproduce_of: str | None = None,
    trigger: str = "prefect",
    run_id: str | None = None,
) -> dict[str, Any]:
    """Run one alignment experiment end to end and return the run record (`alignflow show --json`).

    `run_id` continues a run already recorded by the caller (the CLI records it first so that it can always
    report on it); otherwise the flow records a new run from the other parameters.
    """
    logger = get_run_logger()
    options = {"from_step": from_step, "only": tuple(only or ()), "force": tuple(force or ()), "parent": parent_run,
               "trigger": trigger, "reuse_parent": reuse_parent, "reproduce_of": reproduce_of}
    if run_id is None:
        run_id = start_run_task(str(Path(experiment)), str(Path(hosts)), options)
    remember_run(get_run_context(), run_id)
    store = open_store()
    try:
        _, _, plan, _ = reopen(run_id, store=store)
        parent = reusable_parent_steps(store, run_id)
    finally:
        store.close()
    outcomes: dict[str, dict[str, Any]] = {}
    available: dict[str, dict[str, Any]] = {}
    error: str | None = None
    try:
        preflight_task(run_id)  # before step 1: a configuration mismatch fails the run with nothing run
        available["data"] = data_task(run_id)
        for name in plan.steps:
            if name in CONCURRENT:
                continue
            if name == "compare":
                _run_concurrent(run_id, plan, parent, available, outcomes)
            outcome = (_reuse_from_parent(run_id, name, parent)
                       or step_task.with_options(name=name)(run_id, name, available))
            outcomes[name] = outcome
            available.update(outcome["artifacts"])
        if "compare" not in plan.steps:
            _run_concurrent(run_id, plan, parent, available, outcomes)
    except AlignflowError as exc:
        error = str(exc)
        logger.error("run %s failed: %s", run_id, exc)
    except Exception as exc:  # a task failed: Prefect re-raises the original error
        error = f"{type(exc).__name__}: {exc}"
        logger.error("run %s failed: %s", run_id, error)
    record = finish_task(run_id, outcomes, error=error)
    publish_run_artifacts(record)
    logger.info("run %s: %s, verdict %s, report %s", run_id, record["status"], record["verdict"], record["report"])
    if error is not None:
        raise AlignflowError(f"run {run_id} failed: {error}")
    return record


def _run_concurrent(run_id: str, plan: pipeline.Plan, parent: dict[str, dict[str, ArtifactRef]],
                    available: dict[str, dict[str, Any]], outcomes: dict[str, dict[str, Any]]) -> None:
    """gpu_train and npu_reload_train side by side (they read different checkpoints on different hosts)."""
    futures: dict[str, PrefectFuture[dict[str, Any]] | dict[str, Any]] = {}
    for name in CONCURRENT:
        if name in plan.steps and name not in outcomes:
            reused = _reuse_from_parent(run_id, name, parent)
            futures[name] = reused if reused is not None else step_task.with_options(name=name).submit(
                run_id, name, dict(available))
    errors: list[BaseException] = []
    for name, fut in futures.items():
        try:
            outcome = fut if isinstance(fut, dict) else fut.result()
        except BaseException as exc:  # collect both sides' failures before raising
            errors.append(exc)
            continue
        outcomes[name] = outcome
        available.update(outcome["artifacts"])
    if errors:
        raise errors[0]
