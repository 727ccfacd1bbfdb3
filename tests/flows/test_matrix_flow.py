"""A switch matrix through the alignment flow on the three local hosts: the real twins, Prefect tasks for every
variant's steps, the reference trained once, an OOM recognised, the matrix as one table artifact; then its
goldens recorded and checked through the CLI."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.store import Store
from tests.flows.conftest import FlowEnv, make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]

VARIANTS = {
    "reference": "00_base",
    "warmup_steps": 2,
    "criteria": [{"metric": "lm_loss", "statistic": "mean_rel", "threshold": "0.001%"}],
    "configs": {
        "01_recompute": {"switch": "Recompute off→on", "patch": {"training": {"recompute": "full"}}},
        "02_capacity": {"switch": "GPU memory 1 MiB", "expect": "oom",
                        "patch": {"gpu": {"env": {"ALIGNFLOW_TWIN_DEVICE_MEMORY_MB": "1"}}}},
    },
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_harness: None) -> Iterator[FlowEnv]:
    flow_env = make_flow_env(tmp_path_factory.mktemp("flow-matrix"), repo_root)
    data = yaml.safe_load(flow_env.experiment.read_text())
    data["variants"] = VARIANTS
    flow_env.experiment.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ALIGNFLOW_STATE_DIR", str(flow_env.state))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
        mp.setenv("GLOG_v", "3")
        mp.chdir(flow_env.root)
        yield flow_env


@pytest.fixture(scope="module")
def record(env: FlowEnv) -> dict[str, Any]:
    from flows.alignment import alignment

    result: dict[str, Any] = alignment(experiment=str(env.experiment), hosts=str(env.hosts), trigger="test")
    return result


def test_the_flow_trains_each_variant_once_and_judges_it(env: FlowEnv, record: dict[str, Any]) -> None:
    assert (record["status"], record["verdict"]) == ("completed", "pass"), (record.get("error"), record.get("matrix"))
    assert [(v["name"], v["outcome"], v["status"]) for v in record["variants"]] == [
        ("01_recompute", "pass", "completed"), ("02_capacity", "oom", "oom")]
    with Store.open(state_dir=env.state) as store:
        children = {c.experiment: c for c in store.children(record["run_id"])}
        assert set(children) == {"tiny/01_recompute", "tiny/02_capacity"}
        shared = {s.step: s for s in store.steps(children["tiny/02_capacity"].id)}["npu_reload_train"]
        reference = {s.step: s for s in store.steps(record["run_id"])}["npu_reload_train"]
        assert (shared.status, shared.reused_from) == ("cached", reference.id)  # the reference trained once
        oom = {s.step: s for s in store.steps(children["tiny/02_capacity"].id)}["gpu_train"]
        assert "CUDA out of memory. Tried to allocate" in (oom.error or "")
        matrix = store.matrix(record["run_id"])
        assert matrix is not None
        recompute = [r for r in matrix.summary["rows"] if r["variant"] == "01_recompute"]
        assert {r["side"] for r in recompute} == {"npu", "gpu"}
        # the same mathematics in another order: the curves agree to the printed digit; with one layer there is
        # nothing to save and the recomputed layer's input is kept besides: the peak grows a little
        assert all(r["loss_mean_rel"] is not None and r["loss_mean_rel"] < 1e-5 for r in recompute)
        gpu = next(r for r in recompute if r["side"] == "gpu")
        assert gpu["memory_gib"]["max_rank_on"] > gpu["memory_gib"]["max_rank_off"]
    assert Path(str(record["matrix"]["report"])).is_file()


def test_the_matrix_is_one_table_artifact(record: dict[str, Any]) -> None:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read() -> list[Any]:
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[
                "tiny-matrix"])))

    (artifact,) = asyncio.run(read())[:1]
    assert artifact.type == "table"
    rows = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data
    assert {(r["variant"], r["side"], r["verdict"]) for r in rows} == {
        ("01_recompute", "NPU", "PASS"), ("01_recompute", "GPU", "PASS"), ("02_capacity", "GPU", "OOM")}


def test_each_variants_task_runs_are_named_with_the_variant(record: dict[str, Any]) -> None:
    """Twelve `gpu_train @ cuda` task runs could not be told apart in the UI: a matrix training's carries its
    variant."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def read() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=record[
                "run_id"])))
            tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [r.id for r in runs]}))
            return [t.name for t in tasks]

    names = asyncio.run(read())
    assert "gpu_train @ cuda" in names  # the reference's own
    assert "01_recompute/gpu_train @ cuda" in names
    assert "02_capacity/gpu_train @ cuda" in names


def test_goldens_of_the_matrix_record_and_check_through_the_cli(env: FlowEnv, record: dict[str, Any]) -> None:
    cli = CliRunner()
    recorded = cli.invoke(app, ["golden", "record", record["run_id"], "--json"])
    assert recorded.exit_code == 0, recorded.output
    assert {(r["experiment"], r["side"]) for r in json.loads(recorded.output)} == {
        ("tiny", "npu"), ("tiny", "gpu"), ("tiny/01_recompute", "npu"), ("tiny/01_recompute", "gpu"),
        ("tiny/02_capacity", "npu")}
    checked = cli.invoke(app, ["golden", "check", record["run_id"]])
    assert checked.exit_code == 0, checked.output
    assert "tiny gpu: PASS against golden v1" in checked.output
