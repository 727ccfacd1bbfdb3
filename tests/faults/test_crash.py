"""Crash consistency: `alignflow run` killed with SIGKILL at random points, over several seeds (issue 16).

Each seed forces one step chosen at random (so that step and what depends on it execute again), starts the real
command line on the three local hosts, kills the controller after a random delay inside that run (up to how long
the first run took from the forced step's start on) and then runs the experiment again. Every time:

- the next `alignflow run` completes with verdict PASS;
- every run is in the store and none is left `running` (the killed one is `interrupted`, or had finished);
- no staging directory (`.af-partial-*`) or `.partial` output survives under the hosts' workdirs or the state dir;
- no process the killed controller had started survives it, and the detached jobs it left are gone after
  `alignflow cancel` of the interrupted run (nothing is left to compete for a host).

Every run uses the session's Prefect server, so that each kill lands in the pipeline rather than in a server's
start-up: a per-run server killed with its controller, at start-up or later, is tests/flows/test_server.py's.
Each command is a real process forked from one that imported alignflow, Prefect and the flow once
(tests/faults/forked_cli.py): its own pid, signal handlers and children, ending through the interpreter's exit; the
point is where the kill lands in the pipeline, not ~3 CPU-s of imports per command (three commands a seed).

ALIGNFLOW_CRASH_SEEDS sets how many seeds (default 4 in `make test`, about 25 s each on the 2-core machine; 10 as the
issue asks).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from alignflow.store import RunStatus, Store
from alignflow.transport import JobHandle
from tests.deploy.test_team import live_in_group
from tests.faults.forked_cli import Finished, Zygote
from tests.flows.conftest import make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SEEDS = int(os.environ.get("ALIGNFLOW_CRASH_SEEDS", "4"))  # the issue asks ten: ALIGNFLOW_CRASH_SEEDS=10
STEPS = ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare")


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (by parent links, read from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _leftovers(*roots: Path) -> list[str]:
    return sorted(str(p) for root in roots for p in root.rglob("*")
                  if p.name.startswith(".af-partial-") or p.name.endswith(".partial"))


# what `alignflow run` and `alignflow cancel` import (flows.cli's commands load these as they start)
PRELOAD = """\
import prefect, prefect.flows, prefect.tasks, alignflow.cli, flows.cli, flows.alignment, flows.prefect_client
import alignflow.runner.run, alignflow.runner.session, alignflow.runner.control, alignflow.runview, tasks.progress
"""


def test_a_run_killed_at_random_points_leaves_a_consistent_store_and_nothing_behind(
        tmp_path: Path, repo_root: Path, subprocess_env: dict[str, str], prefect_api_url: str) -> None:
    env = make_flow_env(tmp_path / "crash", repo_root)
    cli_env = {k: v for k, v in subprocess_env.items() if not k.startswith("PREFECT_API")}
    cli_env.update(ALIGNFLOW_STATE_DIR=str(env.state), PREFECT_HOME=str(env.root / "prefect-home"), GLOG_v="3",
                   PREFECT_API_URL=prefect_api_url, DO_NOT_TRACK="1")  # what the command adds before Prefect loads
    run_args = ["run", str(env.experiment), "--hosts", str(env.hosts), "--quiet"]
    (tmp_path / "zygote").mkdir()
    zygote = Zygote(cli_env, tmp_path / "zygote", PRELOAD, exit_like_a_process=True)
    try:
        _killed_at_random_points(zygote, env.root, env.state, run_args)
    finally:
        zygote.close()


def _killed_at_random_points(zygote: Zygote, root: Path, state: Path, run_args: list[str]) -> None:
    def cli(*args: str) -> Finished:
        return zygote.run(list(args), cwd=root)

    t0 = time.monotonic()
    first = cli(*run_args)  # fills the cache; its timing bounds the kill points
    assert first.code == 0, first.stdout + first.stderr
    full_s = time.monotonic() - t0
    with Store.open(state_dir=state) as store:
        (run,) = store.list_runs(limit=1000)
        began = {s.step: (s.started_at - run.started_at).total_seconds() for s in store.steps(run.id) if s.started_at}
    tried, recorded = [], 1
    for seed in range(SEEDS):
        rng = random.Random(seed)
        step = rng.choice(STEPS)
        # a kill point inside the run: what precedes the forced step is taken from the cache in a moment, so the run
        # lasts about as long as the first one did from that step's start on (a delay past it killed nothing)
        delay = rng.uniform(1.0, max(2.0, full_s - began[step]))
        proc = zygote.start([*run_args, "--force", step], cwd=root)
        deadline, below = time.monotonic() + delay, set()
        while time.monotonic() < deadline and _alive(proc.pid):
            below |= _descendants(proc.pid)
            time.sleep(0.2)
        below |= _descendants(proc.pid)
        if _alive(proc.pid):
            os.kill(proc.pid, signal.SIGKILL)  # the controller alone, as `kill -9 PID` does: not its group
            tried.append(f"seed {seed}: --force {step}, killed after {delay:.1f} s")
            proc.wait()
        else:  # the forced step and what follows it took less than the delay: a run that ended on its own
            tried.append(f"seed {seed}: --force {step}, ended (exit {proc.wait().code}) before {delay:.1f} s")

        t_again = time.monotonic()
        again = cli(*run_args)
        tried[-1] += f"; the next run took {time.monotonic() - t_again:.1f} s"
        assert again.code == 0, (tried[-1], again.stdout + again.stderr)
        assert "verdict PASS" in again.stdout, (tried[-1], again.stdout)
        with Store.open(state_dir=state) as store:
            runs = store.list_runs(limit=1000)
            assert not [r.id for r in runs if r.status == RunStatus.RUNNING], tried[-1]
            # the next run and the killed one, unless it was killed before it recorded anything (still importing
            # or validating): then there is no run of it to find
            assert len(runs) - recorded in (1, 2), tried[-1]
            killed = runs[1] if len(runs) - recorded == 2 else None
            if killed is None:
                tried[-1] += " (before it recorded its run)"
            else:
                assert killed.status in (RunStatus.INTERRUPTED, RunStatus.COMPLETED, RunStatus.FAILED), tried[-1]
            jobs = [JobHandle.model_validate(s.job_handle) for s in store.steps(killed.id)
                    if s.job_handle and "pgid" in s.job_handle] if killed is not None else []
            recorded = len(runs)
        job_groups = {job.pgid for job in jobs}  # the detached jobs it left: ended by `alignflow cancel` below
        survivors = [pid for pid in below if _alive(pid) and _pgid(pid) not in job_groups]
        assert not survivors, (tried[-1], "processes of the killed controller survive it", survivors)
        if killed is not None and killed.status == RunStatus.INTERRUPTED:
            cancelled = cli("cancel", killed.id)
            assert cancelled.code == 0, (tried[-1], cancelled.stdout + cancelled.stderr)
        for job in jobs:
            assert not live_in_group(job.pgid), (tried[-1], "a job of the killed run still runs", job)
        assert not _leftovers(state), (tried[-1], _leftovers(state))
    print("\n".join(tried))


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
