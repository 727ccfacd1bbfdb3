"""The steps of a run that the store answers, found in one pass before the walk (issue 48: a cached run that costs
what it does).

A step is reused when a completed step run with its cache key exists and its outputs still hash as recorded on
their hosts (`StepRunner.reuse`). Step by step, that is one hash of each step's outputs on its host, and one Prefect
task with its own runner, transports and thread per step. Here the whole plan is looked at once, in DAG order:

1. each step's executor runs under `StepRunner.probing` as far as its cache lookup (the same code, so the same
   key): it answers `Reusable` with the outputs it would take, or `NotReusable` (forced, no cache entry, an upstream
   step not reusable) before anything is staged, launched or recorded;
2. the outputs of every reusable step are hashed on their hosts, one call per host, the hosts side by side, and
   beside them the run's snapshots of the hosts of its job steps are taken (each job step takes its host's; a
   probe takes one only when its code version comes from it), each a process on its host: in a row, snapshots
   then hashes, they were half of a cached run's flow;
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
from alignflow.config.hosts import Host
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
    as recorded; their outputs are in `runner.verified` once this returns, and the run's snapshots of the hosts of
    its job steps are recorded."""
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
    by_host: dict[str, list[ArtifactRef]] = {}
    for ref in (ref for outcome in found.values() for ref in outcome.artifacts.values()):
        by_host.setdefault(ref.host, []).append(ref)
    job_hosts = {runner.host(s).name: runner.host(s) for s in plan.steps if plan.pipeline.step(s).executor == "job"}
    reached = _open_transports(runner, [*job_hosts.values(), *by_host])
    with ThreadPoolExecutor(max_workers=1 + len(by_host), thread_name_prefix="alignflow-verify") as pool:
        snapshots = pool.submit(_snapshot, runner, [h for h in job_hosts.values() if h.name in reached])
        ok = dict(zip(by_host, pool.map(lambda group: group[0].host in reached and _check(runner, group),
                                        by_host.values()), strict=True))
        snapshots.result()
    unchecked = {verified_key(ref) for host, group in by_host.items() if not ok[host] for ref in group}
    kept: list[str] = []
    dag = plan.pipeline
    for step, outcome in found.items():  # in the order found: every upstream step comes first
        upstream = [u for u in (*dag.upstream(step), *dag.step(step).after) if u in plan.steps]
        if all(u in kept for u in upstream) and not any(verified_key(r) in unchecked
                                                         for r in outcome.artifacts.values()):
            kept.append(step)
    return tuple(kept)


def _open_transports(runner: StepRunner, hosts: list[Host | str]) -> set[str]:
    """Open the transports of `hosts` (a step's placed host, or the host of an artifact by name) here, in one thread:
    the runner's transports are not opened concurrently. The names of the hosts reached; one that cannot be is left
    to its steps, which say why."""
    reached: set[str] = set()
    for host in hosts:
        name = host if isinstance(host, str) else host.name
        if name in reached:
            continue
        try:
            runner.transport_by_name(host) if isinstance(host, str) else runner.transport(host)
        except AlignflowError as exc:
            log.debug("%s: not reached ahead of its steps (%s)", name, exc)
            continue
        reached.add(name)
    return reached


def _snapshot(runner: StepRunner, hosts: list[Host]) -> None:
    try:
        runner.snapshots(hosts)
    except Exception as exc:  # whatever stops a snapshot is its step's to report, as a probe's (`probe`)
        log.debug("snapshots not taken ahead of the steps (%s: %s)", type(exc).__name__, exc)


def _check(runner: StepRunner, group: list[ArtifactRef]) -> bool:
    """Whether every ref of `group` (one host's) still hashes as recorded; False when one does not or the host
    could not hash them (the walk then checks them one step at a time and says why)."""
    try:
        return not runner.verify(group)
    except AlignflowError as exc:
        log.debug("%s: cached outputs not verified (%s)", group[0].host, exc)
        return False
