"""The steps of a run that the store answers, found in one pass before the walk (issue 48: a cached run that costs
what it does).

A step is reused when a completed step run with its cache key exists and its outputs still hash as recorded on
their hosts (`StepRunner.reuse`). Step by step, that is one hash of each step's outputs on its host, and one Prefect
task with its own runner, transports and thread per step. Here the whole plan is looked at once, in DAG order:

0. the snapshots of the hosts of the plan's job steps are taken, the hosts side by side (a job step's code
   version, part of its key, comes from its host's snapshot);
1. each step's executor runs under `StepRunner.probing` as far as its cache lookup (the same code, so the same
   key): it answers `Reusable` with the outputs it would take, or `NotReusable` (forced, no cache entry, an upstream
   step not reusable) before anything is staged, launched or recorded;
2. the outputs of every reusable step are hashed on their hosts, one call per host, the hosts side by side;
3. what still hashes as recorded is the runner's `verified`: the steps themselves then run as always (recording
   their reuse, saying it, ending `Cached`), without hashing those outputs again.

A step whose outputs changed, or could not be checked, is left out with every step downstream of it: the walk runs
them as it always did (and says why a cached result was not taken).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from alignflow import pipeline
from alignflow.errors import AlignflowError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.engine import NotReusable, Reusable, StepRunner, verified_key
from alignflow.runner.session import StepOutcome
from alignflow.runner.steps import EXECUTORS

log = logging.getLogger(__name__)


def probe(runner: StepRunner, step: str, available: Mapping[str, ArtifactRef]) -> StepOutcome | None:
    """The outcome `step` would take from the store (its outputs not yet verified), or None when it would not be
    reused; records nothing."""
    spec = runner.ctx.pipeline.step(step)
    if step in runner.forced:
        return None
    try:
        with runner.probing():
            EXECUTORS[spec.executor](runner, spec, available)
    except Reusable as found:
        return found.outcome
    except NotReusable:
        return None
    except Exception as exc:  # whatever stops the step (a host down, a missing input) is the walk's to report
        log.debug("%s: not probed (%s: %s)", step, type(exc).__name__, exc)
        return None
    raise AssertionError(f"{step}: its executor returned while probed (it must reuse or refuse before executing)")


def reusable_steps(runner: StepRunner, plan: pipeline.Plan, available: Mapping[str, ArtifactRef]) -> tuple[str, ...]:
    """The steps of `plan`, in an order the walk could run them, that reuse a cached result whose outputs still hash
    as recorded; their outputs are in `runner.verified` once this returns."""
    _snapshot_hosts(runner, plan)
    artifacts = dict(available)
    found: dict[str, StepOutcome] = {}
    refused: set[str] = set()
    while ready := plan.ready(done=found, started=refused):
        for step in ready:
            outcome = probe(runner, step, artifacts)
            if outcome is None:
                refused.add(step)  # the steps after it never become ready here: the walk runs them
                continue
            found[step] = outcome
            artifacts.update(outcome.artifacts)
    if not found:
        return ()
    unchecked = _verify_by_host(runner, [ref for outcome in found.values() for ref in outcome.artifacts.values()])
    kept: list[str] = []
    dag = plan.pipeline
    for step, outcome in found.items():  # in the order found: every upstream step comes first
        upstream = [u for u in (*dag.upstream(step), *dag.step(step).after) if u in plan.steps]
        if all(u in kept for u in upstream) and not any(verified_key(r) in unchecked
                                                         for r in outcome.artifacts.values()):
            kept.append(step)
    return tuple(kept)


def _snapshot_hosts(runner: StepRunner, plan: pipeline.Plan) -> None:
    """Take the snapshots of the hosts of the plan's job steps side by side: each job step takes its host's (its
    code version is part of its cache key), and one after another, probing, they cost a process start-up per host.
    A host that cannot be reached is left to its steps, which say so."""
    hosts = {runner.host(s).name: runner.host(s) for s in plan.steps if plan.pipeline.step(s).executor == "job"}
    try:
        runner.snapshots(hosts.values())
    except AlignflowError as exc:
        log.debug("snapshots not taken ahead of the steps (%s)", exc)


def _verify_by_host(runner: StepRunner, refs: list[ArtifactRef]) -> set[tuple[str, str, str]]:
    """Hash `refs` on their hosts, one `sha256` call per host, the hosts side by side; the refs not verified (every
    ref of a host where one changed, vanished or could not be hashed: the walk checks them one step at a time)."""
    by_host: dict[str, list[ArtifactRef]] = {}
    for ref in refs:
        by_host.setdefault(ref.host, []).append(ref)
    for host in by_host:  # opened here, one thread: the runner's transports are not opened concurrently
        runner.transport_by_name(host)

    def check(group: list[ArtifactRef]) -> bool:
        try:
            return not runner.verify(group)
        except AlignflowError as exc:
            log.debug("%s: cached outputs not verified (%s)", group[0].host, exc)
            return False

    with ThreadPoolExecutor(max_workers=max(1, len(by_host)), thread_name_prefix="alignflow-verify") as pool:
        ok = dict(zip(by_host, pool.map(check, by_host.values()), strict=True))
    return {verified_key(ref) for host, group in by_host.items() if not ok[host] for ref in group}
