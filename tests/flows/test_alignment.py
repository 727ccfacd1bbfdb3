"""The alignment flow on the three local hosts: verdict, records, caching, re-runs, invalidation, sentinels.

The tests of this module share one experiment directory and build on each other's runs (in file order): the
first run executes everything; later tests prove what is reused and what is re-executed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.errors import AlignflowError
from alignflow.fingerprint import Fingerprinter
from alignflow.store import Store
from tests.flows.conftest import FlowEnv, make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EVERY_STEP = ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_harness: None) -> Iterator[FlowEnv]:
    flow_env = make_flow_env(tmp_path_factory.mktemp("flow-local"), repo_root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALIGNFLOW_STATE_DIR", str(flow_env.state))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
        mp.setenv("GLOG_v", "3")
        mp.chdir(flow_env.root)
        yield flow_env


def run_flow(env: FlowEnv, **params: Any) -> dict[str, Any]:
    from flows.alignment import alignment

    result: dict[str, Any] = alignment(experiment=str(env.experiment), hosts=str(env.hosts), trigger="test", **params)
    return result


def statuses(record: dict[str, Any]) -> dict[str, str]:
    return {s["step"]: s["status"] for s in record["steps"]}


@pytest.fixture(scope="module")
def first(env: FlowEnv) -> dict[str, Any]:
    return run_flow(env)


def test_full_flow_on_local_hosts_passes_with_every_artifact_fingerprinted(env: FlowEnv, first: dict[str, Any]
                                                                           ) -> None:
    assert first["status"] == "completed", first.get("error")
    assert first["verdict"] == "pass"
    assert statuses(first) == dict.fromkeys(EVERY_STEP, "ran")
    report = Path(first["report"])
    assert report.is_file()
    assert 'class="plot" data-metric="lm_loss"' in report.read_text()  # the interactive curves, inline
    seen = set()
    fingerprinter = Fingerprinter()
    for step in first["steps"]:
        for art in step["artifacts"]:
            seen.add(art["name"])
            # the recorded sha256 is the artifact's real fingerprint where it lives (all hosts are local here)
            assert fingerprinter.fingerprint(art["path"]).sha256 == art["sha256"], art
    assert seen == {"base_ckpt", "npu_base_log", "bf16_ckpt", "megatron_ckpt", "gpu_log", "npu_log", "report"}
    hosts = {s["step"]: s["host"] for s in first["steps"]}
    assert hosts["gpu_train"] == "cuda"
    assert hosts["npu_reload_train"] == "ascend"
    assert hosts["convert_bf16"] == "cpu"


def test_store_holds_snapshots_metrics_and_the_comparison(env: FlowEnv, first: dict[str, Any]) -> None:
    with Store.open(state_dir=env.state) as store:
        run_id = first["run_id"]
        assert {s.host for s in store.snapshots(run_id)} >= {"ascend", "cpu", "cuda"}
        metrics = store.metrics(run_id)
        assert set(metrics["source"]) == {"gpu", "npu", "npu_base"}
        gpu_lm = metrics[(metrics["source"] == "gpu") & (metrics["metric"] == "lm_loss")]
        assert sorted(gpu_lm["step"]) == list(range(1, 9))
        comparison = store.comparison(run_id)
        assert comparison is not None
        assert comparison.verdict == "pass"
        data_inputs = [s.inputs["data"]["sha256"] for s in store.steps(run_id) if "data" in (s.inputs or {})]
        assert len(set(data_inputs)) == 1  # every training read the same data file


def test_second_run_of_the_same_experiment_is_fully_cached(env: FlowEnv, first: dict[str, Any]) -> None:
    second = run_flow(env)
    assert statuses(second) == dict.fromkeys(EVERY_STEP, "cached")
    assert second["verdict"] == "pass"
    with Store.open(state_dir=env.state) as store:
        reused = {s.step: s.reused_from for s in store.steps(second["run_id"])}
        originals = {s.step: s.id for s in store.steps(first["run_id"])}
    assert reused == originals
    # the artifacts are the first run's, fingerprint for fingerprint
    firsts = {a["name"]: a["sha256"] for s in first["steps"] for a in s["artifacts"]}
    assert {a["name"]: a["sha256"] for s in second["steps"] for a in s["artifacts"]} == firsts


# What a fully cached run must not import: it reads no log, trains nothing, writes no report, and its data's
# structure was checked by the run before (issue 48); nor FastAPI (Prefect's encoder of the flow's parameters).
NOT_IN_A_CACHED_RUN = ("torch", "mindspore", "megatron", "pandas", "matplotlib", "plotly", "scipy", "safetensors",
                       "numpy", "fastapi")

_IMPORTS_PROBE = """
import atexit, runpy, sys
def report():
    names = {m.split(".")[0] for m in sys.modules}
    sys.__stdout__.write("\\nLOADED " + " ".join(sorted(names)) + "\\n")
atexit.register(report)
sys.argv = ["alignflow", *sys.argv[1:]]
runpy.run_module("alignflow", run_name="__main__")
"""


def test_a_fully_cached_run_imports_no_framework_pandas_or_matplotlib(
        env: FlowEnv, first: dict[str, Any], subprocess_env: dict[str, str], prefect_api_url: str) -> None:
    done = subprocess.run([sys.executable, "-c", _IMPORTS_PROBE, "run", str(env.experiment), "--hosts",
                           str(env.hosts), "--json"], cwd=env.root, capture_output=True, text=True, timeout=300,
                          check=False, env={**subprocess_env, "PREFECT_API_URL": prefect_api_url,
                                                    "ALIGNFLOW_STATE_DIR": str(env.state)})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.split("\nLOADED ")[0])
    assert statuses(record) == dict.fromkeys(EVERY_STEP, "cached")
    loaded = set(done.stdout.split("\nLOADED ")[1].split())
    assert [name for name in NOT_IN_A_CACHED_RUN if name in loaded] == []


def test_rerun_after_a_spec_change_reexecutes_only_conversion_gpu_training_and_compare(
    env: FlowEnv, first: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = env.root / "twin-moe.yaml"
    spec.write_text(spec.read_text() + "\n# reviewed again after a fix\n")
    # The steps a rerun does not re-execute come from its parent run, not from the cache: with the cache finding
    # nothing, every step that is still `cached` below can only have been supplied by the parent.
    cache_lookups: list[str] = []

    def no_cache(self: Store, step: str, cache_key: str) -> None:
        cache_lookups.append(step)

    monkeypatch.setattr(Store, "find_cached_step", no_cache)
    result = CliRunner().invoke(app, ["rerun", first["run_id"], "--step", "convert_megatron", "--json"])
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    record = json.loads(result.output[result.output.index("{"):])
    assert record["parent_id"] == first["run_id"]
    assert statuses(record) == {"npu_base_train": "cached", "convert_bf16": "cached", "convert_megatron": "ran",
                                "gpu_train": "ran", "npu_reload_train": "cached", "compare": "ran"}
    with Store.open(state_dir=env.state) as store:
        ran = [s.step for s in store.steps(record["run_id"]) if s.status == "ran"]
        assert sorted(ran) == ["compare", "convert_megatron", "gpu_train"]
        # what was reused is the parent's, not a re-execution
        parent_ids = {s.step: s.id for s in store.steps(first["run_id"])}
        for s in store.steps(record["run_id"]):
            if s.status == "cached":
                assert s.reused_from == parent_ids[s.step]
    # the parent's steps were taken without a cache lookup; the re-executed ones are forced (no lookup either)
    assert cache_lookups == []


def test_reproduce_reruns_every_step_and_finds_the_same_fingerprints(env: FlowEnv, first: dict[str, Any]) -> None:
    result = CliRunner().invoke(app, ["reproduce", first["run_id"], "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.index('{\n  "verdict"'):])
    assert out["reproduced"] is True
    diffs = {d["what"]: d for d in out["differences"]}
    # every checkpoint byte-identical (the twin is deterministic); logs differ only in timestamps and timings
    assert not any(k.endswith(("base_ckpt sha256", "bf16_ckpt sha256", "megatron_ckpt sha256")) for k in diffs)
    logs = {what: d for what, d in diffs.items() if what.endswith("_log sha256") and " input " not in what}
    assert set(logs) == {"npu_base_train: npu_base_log sha256", "gpu_train: gpu_log sha256",
                         "npu_reload_train: npu_log sha256"}
    for d in logs.values():
        assert d["cause"].startswith("timing only"), d
    with Store.open(state_dir=env.state) as store:
        reproduction = store.get_run(out["reproduction"])
        assert reproduction.parent_id == first["run_id"]
        assert {s.status for s in store.steps(reproduction.id)} == {"ran"}


def test_a_sentinel_in_the_gpu_log_fails_the_run_although_the_process_exited_0(env: FlowEnv) -> None:
    # A converter of the user's own that loses a tensor: Megatron (and the twin, faithfully) falls back to a
    # non-strict load, prints `load_return:` and trains on with random weights for that tensor, exit code 0.
    drop = ("import sys,torch; p=sys.argv[1]+'/iter_0000001/mp_rank_00/model_optim_rng.pt'; "
            "s=torch.load(p,weights_only=True); del s['model']['decoder.final_layernorm.weight']; torch.save(s,p)")
    original = env.experiment.read_text()
    env.edit_experiment(steps={"convert_megatron": {"command": [
        "bash", "-c", '"$1" -m alignflow convert megatron "$2" "$3" --spec twin-moe --model "$4" && "$1" -c "$5" "$3"',
        "convert", "{python}", "{in:bf16_ckpt}", "{out}/megatron", "{out}/model.json", drop]}})
    try:
        with pytest.raises(AlignflowError) as info:
            run_flow(env)
    finally:
        env.experiment.write_text(original)
    assert "load_return:" in str(info.value)
    with Store.open(state_dir=env.state) as store:
        run = store.list_runs(limit=1)[0]
        assert run.status == "failed"
        steps = {s.step: s for s in store.steps(run.id)}
        assert steps["gpu_train"].status == "failed"
        assert steps["gpu_train"].exit_code == 0  # the process said all was well
        assert "load_return:" in (steps["gpu_train"].error or "")
        assert steps["compare"].status == "skipped"


def test_a_changed_data_file_invalidates_every_step_that_reads_it(env: FlowEnv, first: dict[str, Any]) -> None:
    shutil.rmtree(env.root / "data" / "tiny")
    env.edit_experiment(data__generate__seed=8)
    record = run_flow(env)
    assert statuses(record) == dict.fromkeys(EVERY_STEP, "ran")
    old = {s["step"]: {a["name"]: a["sha256"] for a in s["artifacts"]} for s in first["steps"]}
    new = {s["step"]: {a["name"]: a["sha256"] for a in s["artifacts"]} for s in record["steps"]}
    assert new["npu_base_train"]["base_ckpt"] != old["npu_base_train"]["base_ckpt"]
    assert new["gpu_train"]["gpu_log"] != old["gpu_train"]["gpu_log"]
