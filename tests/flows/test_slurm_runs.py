"""Runs whose hosts are Slurm hosts of the lab's real cluster: preflight, refusals, cancellation, retry, the flow.

The trainings are the twin's (CPU); the GPU host of the flow test is a Slurm host whose training runs as a
two-process torchrun job (gloo), generated from `gpu.parallel: {dp: 2}` and the host's `devices: 2`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from alignflow import pipeline
from alignflow.errors import RemoteJobError
from alignflow.logs.render import mindformers_pynative_line
from alignflow.runner.engine import StepRunner
from alignflow.runner.jobstep import run_job_step
from alignflow.runner.run import data_artifact, execute_pipeline, start_run
from alignflow.runner.session import open_run
from alignflow.store import Store
from alignflow.transport import JobHandle, JobSpec, open_transport
from tests.flows.conftest import LOCAL_HOST_ENV, FlowEnv, make_flow_env
from tests.lab.slurm import SlurmLab

pytestmark = pytest.mark.integration


def _hosts(root: Path, lab: SlurmLab, slurm_roles: dict[str, dict[str, Any]]) -> Path:
    """Local hosts ascend, cpu, cuda; the roles in `slurm_roles` are Slurm hosts of the lab with those settings."""
    hosts: dict[str, Any] = {}
    for name in ("ascend", "cpu", "cuda"):
        body: dict[str, Any] = {"role": name, "transport": "local", "workdir": str(root / "hosts" / name),
                                "env": dict(LOCAL_HOST_ENV)}
        if name in slurm_roles:
            settings = dict(slurm_roles[name])
            devices = settings.pop("devices", None)
            body |= {"scheduler": "slurm", "slurm": {"partition": "debug", **settings},
                     "env": {**LOCAL_HOST_ENV, **lab.env()}}
            if devices:
                body["devices"] = devices
        hosts[name] = body
    path = root / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    return path


@pytest.fixture
def env(tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlowEnv]:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("GLOG_v", "3")
    return make_flow_env(tmp_path, repo_root)


def _with_hosts(env: FlowEnv, hosts: Path) -> FlowEnv:
    return FlowEnv(env.root, env.state, env.experiment, hosts)


def test_a_run_on_an_unknown_partition_fails_in_preflight_and_submits_nothing(env: FlowEnv, slurm_lab: SlurmLab
                                                                               ) -> None:
    env = _with_hosts(env, _hosts(env.root, slurm_lab, {"cuda": {"partition": "nosuch"}}))
    before = slurm_lab.jobs()
    with Store.open(state_dir=env.state) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        view = execute_pipeline(run_id, store=store, state_dir=env.state, transport_factory=open_transport)
        steps = store.steps(run_id)
    assert (view.status, view.verdict) == ("error", None)  # the cluster's configuration, not the alignment
    assert view.error is not None
    assert "cuda: slurm.partition 'nosuch' does not exist; the cluster has: clock, debug, urgent" in view.error
    assert {s.status for s in steps} == {"skipped"}
    assert slurm_lab.jobs() == before


def test_an_sbatch_refusal_fails_the_step_at_once_with_slurms_message(env: FlowEnv, slurm_lab: SlurmLab) -> None:
    env = _with_hosts(env, _hosts(env.root, slurm_lab, {"ascend": {"gpus_per_node": 1}}))  # the node has no GPU
    start = time.monotonic()
    with Store.open(state_dir=env.state) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        view = execute_pipeline(run_id, store=store, state_dir=env.state, transport_factory=open_transport)
        steps = {s.step: s for s in store.steps(run_id)}
    assert time.monotonic() - start < 120  # no training ran
    assert view.status == "failed"
    base = steps["npu_base_train"]
    assert base.status == "failed"
    assert "Slurm refused job" in (base.error or "")
    assert "sbatch: error: Invalid generic resource (gres) specification" in (base.error or "")
    assert {steps[s].status for s in ("convert_bf16", "gpu_train", "compare")} == {"skipped"}


@pytest.mark.parametrize("via", ["core", "flow hook"])
def test_cancelling_a_run_scancels_its_slurm_job(env: FlowEnv, slurm_lab: SlurmLab, via: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from alignflow.config import load_hosts
    from alignflow.runner.control import cancel_run_jobs

    env = _with_hosts(env, _hosts(env.root, slurm_lab, {"cuda": {}}))
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(env.state))
    host = load_hosts(env.hosts).get("cuda")
    with Store.open(state_dir=env.state) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        with open_transport(host) as t:
            handle = t.launch(JobSpec(["sleep", "302"], name="gpu_train"))
            step = store.start_step(run_id, "gpu_train", host="cuda", command="sleep", cache_key="k", inputs={})
            store.attach_job(step.id, job_dir=handle.job_dir, handle=handle.model_dump(mode="json"))
            deadline = time.monotonic() + 60
            while t.status(handle).kind != "running":
                assert time.monotonic() < deadline
                time.sleep(0.3)
        if via == "core":
            assert cancel_run_jobs(store, run_id, transport_factory=open_transport) == [handle.job_dir]
        else:
            from flows.hooks import kill_remote_jobs, remember_run

            flow_run = SimpleNamespace(id="00000000-0000-0000-0000-000000000022")
            remember_run(SimpleNamespace(flow_run=flow_run), run_id)
            kill_remote_jobs(flow=None, flow_run=flow_run, state=None)
        shown = slurm_lab.client(["scontrol", "show", "job", "-o", str(handle.scheduler_id)]).stdout
        assert "JobState=CANCELLED" in shown
        with open_transport(host) as t:
            assert t.status(JobHandle.model_validate(store.get_step(step.id).job_handle or {})).kind == "cancelled"
        assert store.get_run(run_id).status == "cancelled"
        assert store.get_step(step.id).status == "cancelled"


def _preempt_when_running(env: FlowEnv, lab: SlurmLab, done: threading.Event, preempted: list[str]) -> None:
    """When the step's first job runs, submit an urgent job that needs the whole node: Slurm preempts the step's."""
    deadline = time.monotonic() + 300
    while not done.is_set() and time.monotonic() < deadline:
        running = [line for line in lab.jobs() if line.endswith(" RUNNING")]
        if running:
            preempted.append(running[0].split()[0])
            lab.client(["sbatch", "-p", "urgent", "-c", "2", "-o", "/dev/null", "--wrap", "sleep 1"])
            return
        time.sleep(0.2)


def test_a_preempted_job_is_retried_with_a_new_job_when_the_step_says_so(env: FlowEnv, slurm_lab: SlurmLab,
                                                                         tmp_path: Path) -> None:
    env = _with_hosts(env, _hosts(env.root, slurm_lab, {"ascend": {"cpus_per_task": 2}}))
    log = tmp_path / "base.log"
    log.write_text("".join(mindformers_pynative_line(s, 4, loss=5.0, step_time_ms=1, lr=1e-3, grad_norm=1.0,
                                                     consumed_samples=4 * s, global_batch_size=4) + "\n"
                           for s in range(1, 5)))
    exp = yaml.safe_load(env.experiment.read_text())
    # the first job sleeps long enough to be seen running and preempted; the retry's job (the same command) finds
    # the first one's mark and need not wait
    attempted = tmp_path / "attempted"
    exp["steps"] = {"npu_base_train": {"retry_on": ["preempted"], "command": [
        "bash", "-c", '[ -e "$3" ] || { : > "$3"; sleep 8; }; mkdir -p "$1/checkpoint" && '
        'echo 1 > "$1/checkpoint/latest_checkpointed_iteration.txt" && cat "$2"', "x", "{out}", str(log),
        str(attempted)]}}
    env.experiment.write_text(yaml.safe_dump(exp, sort_keys=False))
    done, preempted = threading.Event(), []
    urgent = threading.Thread(target=_preempt_when_running, args=(env, slurm_lab, done, preempted))
    with Store.open(state_dir=env.state) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        ctx = open_run(store, run_id)
        runner = StepRunner(ctx, store=store, state_dir=env.state, transport_factory=open_transport, poll_s=0.5)
        spec = pipeline.DEFAULT.step("npu_base_train")
        urgent.start()
        try:
            data = data_artifact(ctx, state_dir=env.state)
            with pytest.raises(RemoteJobError, match=r"preempted \(Slurm PREEMPTED\)") as first:
                run_job_step(runner, spec, {"data": data})
            assert first.value.retryable  # what run_step's retry reads
            outcome = run_job_step(runner, spec, {"data": data})  # what run_step's retry does (runner.retry)
        finally:
            done.set()
            urgent.join()
            runner.close()
        steps = [s for s in store.steps(run_id) if s.step == "npu_base_train"]
    assert preempted
    assert outcome.status == "ran"
    assert [s.status for s in steps] == ["failed", "ran"]  # one step run per job: the preempted one stays failed
    assert "retried (steps.npu_base_train.retry_on)" in (steps[0].error or "")
    assert steps[0].job_handle is not None
    assert steps[1].job_handle is not None
    assert steps[0].job_handle["scheduler_id"] == preempted[0]
    assert steps[1].job_handle["scheduler_id"] != preempted[0]


@pytest.mark.slow
def test_the_flow_with_a_two_process_torchrun_training_on_a_slurm_host(env: FlowEnv, slurm_lab: SlurmLab,
                                                                       prefect_harness: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole alignment flow, its GPU side a Slurm job of two data-parallel ranks (torchrun, gloo): the
    generated launcher, Slurm's job, the rank-prefixed log parsed at its last rank, and a passing verdict against
    the one-process NPU side (same global batch, same samples per step)."""
    from flows.alignment import alignment

    env = _with_hosts(env, _hosts(env.root, slurm_lab, {"cuda": {"cpus_per_task": 2, "devices": 2}}))
    exp = yaml.safe_load(env.experiment.read_text())
    exp["training"]["micro_batch_size"] = 2  # global batch 4 = micro batch 2 x dp 2 on the GPU side
    exp["gpu"] = {"parallel": {"dp": 2}}
    env.experiment.write_text(yaml.safe_dump(exp, sort_keys=False))
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(env.state))
    monkeypatch.chdir(env.root)
    record: dict[str, Any] = alignment(experiment=str(env.experiment), hosts=str(env.hosts), trigger="test")
    assert record["status"] == "completed", record.get("error")
    assert record["verdict"] == "pass"
    with Store.open(state_dir=env.state, upgrade=False) as store:
        gpu = next(s for s in store.steps(record["run_id"]) if s.step == "gpu_train")
    assert gpu.job_handle is not None
    assert gpu.job_handle["scheduler_id"].isdigit()  # a Slurm job
    assert "torch.distributed.run --nproc_per_node 2 --nnodes 1 --standalone" in (gpu.command or "")
    out = Path(gpu.job_handle["out"])
    train_log = (out / "train.log").read_text()
    assert "[1]: [" in train_log
    assert " iteration        8/       8 |" in train_log
    assert "[0]:training ..." in train_log
    rank_logs = sorted(p.parent.name for p in (out / "rank_logs").rglob("stdout.log"))
    assert rank_logs == ["0", "1"]  # every rank's own log is kept beside the job's
    report = Path(record["report"]).with_name("summary.md").read_text()
    assert "- GPU: rank 1 of this multi-process log is compared - the highest rank that printed losses, i.e. the " \
           "last pipeline stage" in report


@pytest.mark.slow
def test_alignflow_run_passes_with_its_cuda_host_on_slurm(env: FlowEnv, slurm_lab: SlurmLab,
                                                          subprocess_env: dict[str, str], prefect_api_url: str) -> None:
    """`alignflow run` as a user types it, its GPU side one Slurm job of one process (the twin, CPU). The tiny
    experiment: what runs on Slurm is the same at any depth, and the committed demo's 4 layers and 30 steps cost
    about 30 CPU-s more of trainings here (51 against 19 by process accounting); CI runs the demo itself
    (`make demo` in .ci/run)."""
    import json
    import subprocess
    import sys

    hosts = _hosts(env.root, slurm_lab, {"cuda": {}})
    cli_env = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(env.state), "GLOG_v": "3",
               "PREFECT_HOME": str(env.root / "prefect"), "PREFECT_API_URL": prefect_api_url}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "alignflow", "run", str(env.experiment), "--hosts", str(hosts),
                           "--json"], cwd=env.root, env=cli_env, capture_output=True, text=True, timeout=3600,
                          check=False)
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout)
    assert (record["status"], record["verdict"]) == ("completed", "pass")
    gpu = next(s for s in record["steps"] if s["step"] == "gpu_train")
    assert gpu["host"] == "cuda"
    with Store.open(state_dir=env.state, upgrade=False) as store:
        handle = next(s for s in store.steps(record["run_id"]) if s.step == "gpu_train").job_handle
    assert handle is not None
    assert handle["scheduler_id"].isdigit()
    print(f"alignflow run on Slurm: {wall:.0f} s, verdict {record['verdict']}")
