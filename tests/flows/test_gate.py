"""The checks before the long trainings, through the alignment flow on the three local hosts: preflight fails a
misconfigured run before step 1, and the early gate passes on the twin but stops a run whose conversion spec lost
a GLU de-interleave (shapes still match, so the converter succeeds) before gpu_train / npu_reload_train start.

`alignflow diagnose RUN`, typed as a user does, then diagnoses both recorded runs: the clean one has no divergent
module (exit 0), the broken one diverges at the shared expert's fc1 as a conversion bug (exit 1).

The tests share one experiment directory (the tiny twin experiment with `gate: {enabled: true}`) and build on each
other's runs in file order: the second run reuses the first one's base training and bf16 checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from alignflow.errors import AlignflowError
from alignflow.store import Store
from tests.flows.conftest import FlowEnv, make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EVERY_STEP = ("npu_base_train", "convert_bf16", "convert_megatron", "early_gate", "gpu_train", "npu_reload_train",
              "compare")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_harness: None) -> Iterator[FlowEnv]:
    flow_env = make_flow_env(tmp_path_factory.mktemp("flow-gate"), repo_root)
    flow_env.edit_experiment(gate={"enabled": True})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALIGNFLOW_STATE_DIR", str(flow_env.state))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
        mp.setenv("GLOG_v", "3")
        mp.chdir(flow_env.root)
        yield flow_env


def run_flow(env: FlowEnv) -> dict[str, Any]:
    from flows.alignment import alignment

    result: dict[str, Any] = alignment(experiment=str(env.experiment), hosts=str(env.hosts), trigger="test")
    return result


def last_run_steps(env: FlowEnv) -> tuple[Any, dict[str, Any]]:
    with Store.open(state_dir=env.state) as store:
        run = store.list_runs(limit=1)[0]
        return run, {s.step: s for s in store.steps(run.id)}


def test_preflight_mismatch_fails_the_flow_run_before_step_1(env: FlowEnv) -> None:
    original = env.experiment.read_text()
    env.edit_experiment(gpu={"extra_args": ["--seed", "42"]})
    try:
        with pytest.raises(AlignflowError, match="preflight: 2 of"):
            run_flow(env)
    finally:
        env.experiment.write_text(original)
    run, steps = last_run_steps(env)
    assert (run.status, run.verdict) == ("error", None)  # a configuration error, never a failed alignment
    assert "data order seed: NPU 1234 (train_dataset.dataloader.config.seed) vs GPU 42 (--seed)" in (run.error or "")
    assert {name: s.status for name, s in steps.items()} == dict.fromkeys(EVERY_STEP, "skipped")
    assert all(s.job_dir is None for s in steps.values())
    assert not (env.root / "data" / "tiny").exists()  # nothing ran, not even the data generation


@pytest.fixture(scope="module")
def first(env: FlowEnv) -> dict[str, Any]:
    return run_flow(env)


def test_gate_passes_on_the_twin_before_the_long_trainings(env: FlowEnv, first: dict[str, Any]) -> None:
    assert first["status"] == "completed", first.get("error")
    assert first["verdict"] == "pass"
    assert {s["step"]: s["status"] for s in first["steps"]} == dict.fromkeys(EVERY_STEP, "ran")
    gate = next(s for s in first["steps"] if s["step"] == "early_gate")
    (report,) = [a for a in gate["artifacts"] if a["name"] == "gate_report"]
    rows = json.loads((Path(report["path"]) / "gate.json").read_text())
    assert rows["passed"] is True
    assert {r["metric"] for r in rows["rows"]} == {"lm_loss", "mtp_1_loss"}
    assert all(r["rel_diff"] < 5e-5 for r in rows["rows"])
    _, steps = last_run_steps(env)
    # both sides' jobs were recorded under the gate's step run (a cancelled run finds and kills them)
    jobs = (steps["early_gate"].job_handle or {}).get("jobs", [])
    assert [(j["host"], j["name"].rsplit("-", 1)[-1]) for j in jobs] == [
        (steps["npu_reload_train"].host, "npu"), (steps["gpu_train"].host, "gpu")]
    # the gate holds back the GPU training it exists to save; the NPU reload training reads only the bf16
    # checkpoint, so it runs beside the Megatron conversion and the gate (the pipeline's DAG)
    assert steps["early_gate"].finished_at <= steps["gpu_train"].started_at
    assert steps["npu_reload_train"].started_at < steps["early_gate"].finished_at


def test_gate_stops_a_run_whose_spec_lost_the_shared_expert_deinterleave(env: FlowEnv, first: dict[str, Any]
                                                                         ) -> None:
    # docs/seeds.md#moe-shared-expert-fc1-not-de-interleaved: the shared expert's fc1 copied without de-interleaving
    # converts without a shape error
    spec = env.root / "twin-moe.yaml"
    text = spec.read_text()
    broken = text.replace("ops: [deinterleave_rows], shape: [2 * shared_ffn", "shape: [2 * shared_ffn")
    assert broken != text
    spec.write_text(broken)
    try:
        with pytest.raises(AlignflowError, match="early gate failed"):
            run_flow(env)
    finally:
        spec.write_text(text)
    run, steps = last_run_steps(env)
    assert (run.status, run.verdict) == ("failed", "fail")  # the gate's finding is a verdict on the alignment
    assert {name: s.status for name, s in steps.items()} == {
        "npu_base_train": "cached", "convert_bf16": "cached", "convert_megatron": "ran", "early_gate": "failed",
        "gpu_train": "skipped", "npu_reload_train": "cached", "compare": "skipped", "diagnose": "ran"}
    # the GPU training never started (no job, no start time); the NPU reload training, which does not depend on the
    # Megatron conversion, ran beside the gate (here: reused from the first run, its inputs unchanged)
    assert steps["gpu_train"].job_dir is None
    assert steps["gpu_train"].started_at is None
    error = steps["early_gate"].error or ""
    assert "the conversion (spec) or the model configuration" in error
    assert "lm_loss: NPU" in error
    assert error in (run.error or "")
    # the failed gate was diagnosed at the tensor level, as a recorded step of the run: the layer and the cause
    # (the diagnosis reads the weights through the experiment's own spec, which here is the broken one, so both
    # sides agree with it after load; each side's SwiGLU reads the fc1 rows in another order: a conversion bug)
    assert re.search(r"diagnose: diverged at decoder\.layers\.0\.mlp\.shared_experts\.linear_fc1 \(conversion\)",
                     run.error or ""), run.error
    assert steps["diagnose"].job_handle
    assert len(steps["diagnose"].job_handle["jobs"]) == 2


def _diagnose(env: FlowEnv, repo_root: Path, run_id: str) -> subprocess.CompletedProcess[str]:
    """`alignflow diagnose RUN` as a user types it: a subprocess, from another directory than the experiment's (its
    spec file is found beside the recorded experiment, not in the working directory)."""
    return subprocess.run([sys.executable, "-m", "alignflow", "diagnose", run_id], cwd=repo_root, env=dict(os.environ),
                          capture_output=True, text=True, timeout=900, check=False)


def test_diagnose_of_the_clean_run_finds_no_divergent_module(env: FlowEnv, first: dict[str, Any],
                                                            repo_root: Path) -> None:
    # issue 40: `alignflow diagnose RUN` failed on every run ("step 'diagnose' is optional and not enabled")
    done = _diagnose(env, repo_root, first["run_id"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: no divergent module" in done.stdout
    with Store.open(state_dir=env.state) as store:
        child = store.list_runs(limit=1)[0]
        steps = {s.step: s.status for s in store.steps(child.id)}
    assert (child.parent_id, child.trigger, child.status) == (first["run_id"], "diagnose", "completed")
    assert steps["diagnose"] == "ran"
    assert {steps[s] for s in ("npu_base_train", "convert_bf16", "convert_megatron")} == {"cached"}


def test_diagnose_of_the_run_with_the_seeded_shared_expert_bug_names_module_and_cause(env: FlowEnv,
                                                                                      repo_root: Path) -> None:
    # the run whose conversion lost the shared expert's de-interleave (the spec is fixed again since): its
    # converted checkpoint holds the fc1 rows in MindFormers' interleaved order, read through the correct spec
    with Store.open(state_dir=env.state) as store:
        broken = next(r for r in store.list_runs() if r.verdict == "fail")
    done = _diagnose(env, repo_root, broken.id)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"DIVERGED at decoder\.layers\.0\.mlp\.shared_experts\.linear_fc1 — conversion", done.stdout), \
        done.stdout
