"""Cancelling a run kills its remote jobs: the core function and the flow's cancellation hook."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from alignflow.config import load_hosts
from alignflow.runner.control import cancel_run_jobs
from alignflow.runner.run import start_run
from alignflow.store import Store
from alignflow.transport import JobHandle, JobSpec, open_transport
from tests.flows.conftest import make_flow_env


def _group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.integration
@pytest.mark.parametrize("via", ["core", "flow hook"])
def test_cancelling_a_run_kills_the_remote_process_group(tmp_path: Path, repo_root: Path, via: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_flow_env(tmp_path, repo_root)
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(env.state))
    with Store.open(state_dir=env.state) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        host = load_hosts(env.hosts).get("cuda")
        with open_transport(host) as t:
            # a training that would run for minutes, with a child process (as torchrun would have)
            handle = t.launch(JobSpec(argv=["bash", "-c", "sleep 300 & sleep 300; wait"], name="gpu_train"))
            step = store.start_step(run_id, "gpu_train", host="cuda", command="sleep", cache_key="k", inputs={})
            store.attach_job(step.id, job_dir=handle.job_dir, handle=handle.model_dump(mode="json"))
            deadline = time.monotonic() + 10
            while t.status(handle).kind != "running" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _pid_alive(handle.pid)
            while len(_group(handle.pgid)) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(_group(handle.pgid)) >= 3  # supervisor, bash, the two sleeps
        if via == "core":
            killed = cancel_run_jobs(store, run_id, transport_factory=open_transport)
            assert killed == [handle.job_dir]
        else:
            from flows.hooks import kill_remote_jobs, remember_run

            flow_run = SimpleNamespace(id="00000000-0000-0000-0000-000000000001")
            remember_run(SimpleNamespace(flow_run=flow_run), run_id)
            kill_remote_jobs(flow=None, flow_run=flow_run, state=None)
        with open_transport(host) as t:
            assert t.status(JobHandle.model_validate(handle.model_dump(mode="json"))).kind == "cancelled"
        deadline = time.monotonic() + 15
        while _group(handle.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group(handle.pgid) == []  # the whole group, children included
        run = store.get_run(run_id)
        assert run.status == "cancelled"
        recorded = store.get_step(step.id)
        assert recorded.status == "cancelled"
        assert "cancelled" in (recorded.error or "")


@pytest.mark.integration
def test_cancelling_a_run_in_its_early_gate_kills_both_sides(tmp_path: Path, repo_root: Path) -> None:
    """The gate runs one job per side under one step run: both are recorded, both are killed."""
    from alignflow.runner.recording import StepRecord

    env = make_flow_env(tmp_path, repo_root)
    inventory = load_hosts(env.hosts, state_dir=env.state)
    with Store.open(state_dir=env.state) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        step = store.start_step(run_id, "early_gate", host="cpu", command="gate", cache_key="k", inputs={})
        handles = []
        for role in ("ascend", "cuda"):
            with open_transport(inventory.get(role)) as t:
                handles.append(t.launch(JobSpec(argv=["bash", "-c", "sleep 300 & sleep 300; wait"],
                                                name=f"gate-{role}")))
        StepRecord(store, step).attach(handles)
        deadline = time.monotonic() + 10
        while any(len(_group(h.pgid)) < 3 for h in handles) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(len(_group(h.pgid)) >= 3 for h in handles)
        killed = cancel_run_jobs(store, run_id, transport_factory=open_transport)
        assert killed == [h.job_dir for h in handles]
        deadline = time.monotonic() + 15
        while any(_group(h.pgid) for h in handles) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [_group(h.pgid) for h in handles] == [[], []]
        for h in handles:
            with open_transport(inventory.get(h.host)) as t:
                assert t.status(h).kind == "cancelled"
        assert store.get_step(step.id).status == "cancelled"
