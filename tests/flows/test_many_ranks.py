"""Issue 36's acceptance through the flow: an experiment with `gpu.parallel: {tp: 2, pp: 2}` runs end to end on the
twins - the bf16 checkpoint converted to torch_dist (`conversion.format: auto` at four GPU ranks), the PyTorch twin
loading it at tp 2 x pp 2 under torchrun (four gloo processes on the `cuda` host, four devices), the comparison
reading the rank that prints the losses (the last pipeline stage) and saying so, and every rank's memory report in
the report and its JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from alignflow.store import Store
from tests.flows.conftest import FlowEnv, make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_harness: None) -> Iterator[FlowEnv]:
    root = tmp_path_factory.mktemp("flow-many-ranks")
    root.mkdir(parents=True, exist_ok=True)
    hosts = root / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {
        name: {"role": name, "transport": "local", "workdir": f"hosts/{name}",
               **({"devices": 4} if name == "cuda" else {})} for name in ("ascend", "cpu", "cuda")}}))
    flow_env = make_flow_env(root, repo_root, hosts=hosts)
    doc = yaml.safe_load(flow_env.experiment.read_text())
    doc["name"] = "tiny-tp2-pp2"
    doc["model"]["num_layers"] = 2  # one per pipeline stage: a dense layer, then the MoE layer with the MTP block
    doc["model"]["moe"]["layer_freq"] = [0, 1]
    doc["gpu"] = {"parallel": {"tp": 2, "pp": 2}}
    flow_env.experiment.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALIGNFLOW_STATE_DIR", str(flow_env.state))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
        mp.setenv("GLOG_v", "3")
        mp.setenv("OMP_NUM_THREADS", "1")  # four gloo ranks on a small machine
        mp.chdir(flow_env.root)
        yield flow_env


@pytest.fixture(scope="module")
def run(env: FlowEnv) -> dict[str, Any]:
    from flows.alignment import alignment

    result: dict[str, Any] = alignment(experiment=str(env.experiment), hosts=str(env.hosts), trigger="test")
    return result


def test_tp2_pp2_runs_end_to_end_with_per_rank_memory_in_the_report(env: FlowEnv, run: dict[str, Any]) -> None:
    assert run["status"] == "completed", run.get("error")
    assert run["verdict"] == "pass"
    with Store.open(state_dir=env.state) as store:
        steps = {s.step: s for s in store.steps(run["run_id"])}
    convert, train = steps["convert_megatron"].command or "", steps["gpu_train"].command or ""
    assert "--ckpt-format torch_dist" in convert
    assert "--nproc_per_node 4" in train
    assert "--tensor-model-parallel-size 2" in train
    assert "--pipeline-model-parallel-size 2" in train
    assert "--ckpt-format torch_dist" in train
    # the log the controller fetched holds every rank's lines (torchrun's tee, each prefixed with its rank)
    fetched = (env.state / "runs" / run["run_id"] / "logs" / "gpu_train.log").read_text()
    for rank in range(4):
        assert f"[{rank}]:[Rank {rank}] (after 1 iterations) memory (MB) | allocated: " in fetched
    reports = sorted((env.state / "reports").glob(f"{run['run_id']}-*"))
    assert len(reports) == 1
    doc = json.loads((reports[0] / "comparison.json").read_text())
    assert doc["inputs"]["reference"]["rank"] == 3  # the last pipeline stage's last tensor rank logs the loss
    gpu = doc["memory"]["reference"]
    assert sorted(gpu["per_rank"]) == ["0", "1", "2", "3"]
    assert gpu["max_rank"] == max(gpu["per_rank"].values())
    assert all(v > 0 for v in gpu["per_rank"].values())
    # the stages hold different parts of the model: the per-rank figures are not one number copied
    assert len(set(gpu["per_rank"].values())) > 1
    # the MindSpore twin prints MindSpore's end-of-run statistics (MS_MEMORY_STATISTIC=1): its allocator model
    npu = doc["memory"]["test"]
    assert npu["sources"] == ["mindspore"]
    assert npu["metric"] == gpu["metric"] == "max_allocated_mb"
    assert all(v > 0 for v in npu["per_rank"].values())
    html = (reports[0] / "report.html").read_text()
    assert 'id="memory-table"' in html
    assert "rank 3 of this multi-process log is compared" in html
