"""kill -9 of `alignflow run` in the middle of the trainings: the run is shown interrupted with its jobs, and
`alignflow rerun` of it completes, reusing every step that had finished (none of them runs again).

The real command line, the real flow on the three local hosts, a real Prefect server (the session's, which the
command lines are pointed at); the controller is killed with SIGKILL, so nothing of it gets to clean up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alignflow.store import RunStatus, StepStatus, Store
from alignflow.transport import JobHandle, open_transport
from tests.flows.conftest import FlowEnv, make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]
TRAININGS = ("gpu_train", "npu_reload_train")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, subprocess_env: dict[str, str],
        prefect_api_url: str) -> tuple[FlowEnv, dict[str, str]]:
    flow_env = make_flow_env(tmp_path_factory.mktemp("interrupt"), repo_root)
    cli_env = {k: v for k, v in subprocess_env.items() if not k.startswith("PREFECT_API")}
    cli_env.update(ALIGNFLOW_STATE_DIR=str(flow_env.state), PREFECT_HOME=str(flow_env.root / "prefect-home"),
                   PREFECT_API_URL=prefect_api_url, GLOG_v="3")
    return flow_env, cli_env


def _cli(env: FlowEnv, cli_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", *args], cwd=env.root, env=cli_env, capture_output=True,
                          text=True, timeout=1200, check=False)


def _wait_for_trainings(env: FlowEnv, proc: subprocess.Popen[bytes], timeout_s: float = 900) -> str:
    """The run id, once both trainings have launched their jobs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "alignflow run ended before the trainings started"
        if (env.state / "store.sqlite").exists():
            with Store.open(state_dir=env.state) as store:
                for run in store.list_runs(limit=1):
                    jobs = {s.step for s in store.steps(run.id) if s.job_dir}
                    if set(TRAININGS) <= jobs:
                        return run.id
        time.sleep(1)
    raise AssertionError("the trainings did not start in time")


def test_a_killed_controller_leaves_an_interrupted_run_that_rerun_completes(env: tuple[FlowEnv, dict[str, str]]
                                                                            ) -> None:
    flow_env, cli_env = env
    proc = subprocess.Popen([sys.executable, "-m", "alignflow", "run", str(flow_env.experiment), "--hosts",
                             str(flow_env.hosts), "--quiet"], cwd=flow_env.root, env=cli_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_id = _wait_for_trainings(flow_env, proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    history = _cli(flow_env, cli_env, "history")
    assert history.returncode == 0, history.stderr
    assert f"run {run_id} of tiny interrupted" in history.stderr
    for step in TRAININGS:
        assert f"interrupted {run_id}: {step} on " in history.stdout
    with Store.open(state_dir=flow_env.state) as store:
        killed = store.get_run(run_id)
        assert killed.status == RunStatus.INTERRUPTED
        before = {s.step: s for s in store.steps(run_id)}
        handles = [JobHandle.from_dict(before[s].job_handle or {}) for s in TRAININGS]
        inventory_hosts = killed.params["inventory"]["hosts"]
    finished = {name for name, s in before.items() if s.status in (StepStatus.RAN, StepStatus.CACHED)}
    assert {"npu_base_train", "convert_bf16", "convert_megatron"} <= finished

    rerun = _cli(flow_env, cli_env, "rerun", run_id, "--quiet")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "verdict PASS" in rerun.stdout
    with Store.open(state_dir=flow_env.state) as store:
        (child,) = store.children(run_id)
        assert child.status == RunStatus.COMPLETED
        after = {s.step: s for s in store.steps(child.id)}
    for name in finished:  # reused: not one of them executed again
        assert after[name].status == StepStatus.CACHED, name
        assert after[name].reused_from == (before[name].reused_from or before[name].id)
    for step in TRAININGS:
        assert after[step].status == StepStatus.RAN
    from alignflow.config.hosts import Host

    for handle in handles:  # the jobs the killed controller left were ended, not left to compete for their hosts
        with open_transport(Host.model_validate(inventory_hosts[handle.host])) as t:
            assert t.status(handle).kind in ("cancelled", "exited")
