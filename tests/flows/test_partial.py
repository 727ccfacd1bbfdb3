"""Partial runs as a user types them (issue 40): `alignflow run EXP --only STEP` that did what it was asked exits 0
and says what it did not run; it probes only the hosts of the steps it executes; a run stopped by its configuration
or environment ends `error` (exit 2), never a failed alignment.

The experiment is the tiny twin with a real Megatron-LM GPU side whose `gpu.entry` no host has: a run that trains
the GPU side is refused by preflight's probe of the cuda host, one that only trains and converts the NPU side must
not be. Real command lines (`python -m alignflow`) on the three local hosts, Prefect the session's test server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.store import Store
from tests.flows.conftest import FlowEnv, make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ENTRY = "/nonexistent/Megatron-LM/pretrain_gpt.py"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, repo_root: Path) -> FlowEnv:
    flow_env = make_flow_env(tmp_path_factory.mktemp("flow-partial"), repo_root)
    flow_env.edit_experiment(gpu={"kind": "megatron", "entry": ENTRY, "torchrun": {"nproc_per_node": 1},
                                  "megatron_version": "0.19", "transformer_impl": "local"})
    return flow_env


@pytest.fixture(scope="module")
def cli(env: FlowEnv, subprocess_env: dict[str, str], prefect_api_url: str):  # type: ignore[no-untyped-def]
    child = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(env.state), "PREFECT_API_URL": prefect_api_url,
             "GLOG_v": "3", "COLUMNS": "200"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "alignflow", *args], cwd=env.root, env=child,
                              capture_output=True, text=True, timeout=900, check=False)

    return run


def _last_run(env: FlowEnv) -> tuple[object, dict[str, str]]:
    with Store.open(state_dir=env.state) as store:
        run = store.list_runs(limit=1)[0]
        return run, {s.step: s.status for s in store.steps(run.id)}


def test_only_the_base_training_exits_0_says_what_it_did_not_run_and_never_probes_the_gpu_host(
        env: FlowEnv, cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", str(env.experiment), "--hosts", str(env.hosts), "--only", "npu_base_train")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not run: convert_bf16, convert_megatron, gpu_train, npu_reload_train, compare (not selected for this " \
           "run; no verdict)" in done.stdout
    run, steps = _last_run(env)
    assert (run.status, run.verdict) == ("completed", None)  # type: ignore[attr-defined]
    assert steps["npu_base_train"] == "ran"
    both = cli("run", str(env.experiment), "--hosts", str(env.hosts), "--only", "npu_base_train", "--only",
               "convert_bf16", "--quiet")
    assert both.returncode == 0, both.stdout + both.stderr
    assert "not run: convert_megatron, gpu_train, npu_reload_train, compare" in both.stdout
    _, steps = _last_run(env)
    assert (steps["npu_base_train"], steps["convert_bf16"]) == ("cached", "ran")


def test_a_step_on_the_gpu_host_is_probed_and_refused_as_an_environment_error(env: FlowEnv, cli) -> None:  # type: ignore[no-untyped-def]
    done = cli("run", str(env.experiment), "--hosts", str(env.hosts), "--only", "gpu_train", "--quiet")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"gpu.entry {ENTRY} does not exist" in done.stdout
    run, steps = _last_run(env)
    assert (run.status, run.verdict) == ("error", None)  # type: ignore[attr-defined]
    assert "gpu_train" not in {s for s, status in steps.items() if status != "skipped"}
    history = cli("history")
    assert " error " in history.stdout


def test_a_mistyped_spec_never_starts_a_run(env: FlowEnv, cli) -> None:  # type: ignore[no-untyped-def]
    original = env.experiment.read_text()
    env.experiment.write_text(original.replace("spec: twin-moe.yaml", "spec: twin-moe.yml"))
    try:
        with Store.open(state_dir=env.state) as store:
            before = len(store.list_runs())
        done = cli("run", str(env.experiment), "--hosts", str(env.hosts))
    finally:
        env.experiment.write_text(original)
    assert done.returncode == 2
    assert "conversion.spec: spec file 'twin-moe.yml' not found" in done.stderr
    assert "(did you mean 'twin-moe.yaml'?)" in done.stderr
    with Store.open(state_dir=env.state) as store:
        assert len(store.list_runs()) == before
