"""The alignment flow across the SSH lab: three real sshd hosts whose users cannot read each other's workdirs.

One run: the controller stages the data, every checkpoint moves host to host through the transport (sha256
verified on arrival), and the SSH connections to the GPU host are cut while `gpu_train` runs — the detached job
finishes and the flow collects it after reconnecting.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alignflow.store import Store
from tests.flows.conftest import LOCAL_HOST_ENV, FlowEnv, make_flow_env
from tests.lab.sshd import SSHLab

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_harness: None, ssh_lab: SSHLab
        ) -> Iterator[FlowEnv]:
    root = tmp_path_factory.mktemp("flow-ssh")
    hosts = ssh_lab.write_hosts_yaml(root / "hosts.yaml", overrides={
        name: {"env": {"PYTHONPATH": ssh_lab.pythonpath, "GLOG_v": "3", **LOCAL_HOST_ENV}} for name in ssh_lab.hosts})
    flow_env = make_flow_env(root, repo_root, hosts=hosts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALIGNFLOW_STATE_DIR", str(flow_env.state))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
        mp.chdir(flow_env.root)
        yield flow_env


def _cut_gpu_connections_while_training(env: FlowEnv, lab: SSHLab, done: threading.Event, cuts: list[int]) -> None:
    """Wait until gpu_train's job is recorded as running, then kill every SSH connection to the GPU host."""
    deadline = time.monotonic() + 600
    while not done.is_set() and time.monotonic() < deadline:
        try:
            with Store.open(state_dir=env.state, upgrade=False) as store:
                runs = store.list_runs(limit=1)
                running = [s for s in store.steps(runs[0].id) if s.step == "gpu_train" and s.status == "running"
                           and s.job_handle] if runs else []
        except Exception:  # the store may not exist yet
            running = []
        if running:
            time.sleep(1.0)  # let the poller hold its connection
            cuts.append(lab.kill_connections("cuda"))
            return
        time.sleep(0.2)


def test_full_flow_across_ssh_hosts_survives_a_cut_connection(env: FlowEnv, ssh_lab: SSHLab) -> None:
    from flows.alignment import alignment

    done, cuts = threading.Event(), []
    cutter = threading.Thread(target=_cut_gpu_connections_while_training, args=(env, ssh_lab, done, cuts))
    cutter.start()
    try:
        record: dict[str, Any] = alignment(experiment=str(env.experiment), hosts=str(env.hosts), trigger="test")
    finally:
        done.set()
        cutter.join()
    assert cuts, "the GPU host's SSH connection was never cut"
    assert cuts[0] >= 1
    assert record["status"] == "completed", record.get("error")
    assert record["verdict"] == "pass"
    steps = {s["step"]: s for s in record["steps"]}
    assert {s["status"] for s in steps.values()} == {"ran"}
    assert steps["gpu_train"]["host"] == "cuda"

    # The Megatron checkpoint was written on the CPU host and reached the GPU host by transfer: the path the
    # GPU training loaded lies in the cuda user's workdir, and the cuda user cannot read the cpu workdir.
    megatron = next(a for a in steps["convert_megatron"]["artifacts"] if a["name"] == "megatron_ckpt")
    assert megatron["host"] == "cpu"
    assert megatron["path"].startswith(str(ssh_lab.hosts["cpu"].workdir))
    with Store.open(state_dir=env.state) as store:
        gpu = next(s for s in store.steps(record["run_id"]) if s.step == "gpu_train")
    argv = shlex.split(gpu.command or "")
    loaded = argv[argv.index("--load") + 1]
    assert loaded.startswith(str(ssh_lab.hosts["cuda"].workdir))
    assert ssh_lab.run_as("cuda", ["test", "-f", f"{loaded}/latest_checkpointed_iteration.txt"]).returncode == 0
    assert ssh_lab.run_as("cuda", ["ls", megatron["path"]]).returncode != 0
