"""A run's parameters: typed records through one versioned codec; runs recorded by an older alignflow still open.

`tests/data/records/run_params_v1.json` is what alignflow wrote for a run before the codec had versions (issue 34):
a `rerun --only gpu_train` of tests/data/flow/tiny.yaml naming `hosts: {cuda: gpu-b}`, on an inventory of four
local hosts under a state dir of its own, recorded by `start_run` of that version (the paths of the machine it
ran on replaced by /srv/alignflow).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from alignflow import pipeline
from alignflow.config.placement import place
from alignflow.errors import ConfigError, StoreError
from alignflow.store import Store
from alignflow.store import database as db
from alignflow.store.models import Run
from alignflow.store.params import PARAMS_VERSION, NoiseRunParams, RunOptions, RunParams, decode_params
from tests.store.sample import CONFIG, CONFIG_SHA, run_params

V1 = Path(__file__).parents[1] / "data" / "records" / "run_params_v1.json"


def _stored_as(db_url: str, run_id: str, doc: dict[str, Any]) -> None:
    """Overwrite a run's parameters with `doc`, as another alignflow wrote them into the database."""
    engine = db.create_store_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(update(Run).where(Run.id == run_id).values(params=doc))
    finally:
        engine.dispose()


def _run(store: Store) -> str:
    store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    return store.create_run("demo", trigger="cli", code_version="v", params=run_params()).id


def test_a_run_recorded_before_the_codec_had_versions_opens_with_its_steps_placed_as_it_placed_them(
        store: Store, db_url: str) -> None:
    run_id = _run(store)
    _stored_as(db_url, run_id, json.loads(V1.read_text()))
    params = store.get_run(run_id).alignment_params()
    assert params.experiment.name == "tiny"
    assert params.experiment.source == params.experiment_path == "/srv/alignflow/experiments/tiny.yaml"
    assert params.inventory.source == "/srv/alignflow/hosts.yaml"
    assert params.inventory.get("gpu-a").env == {"NCCL_DEBUG": "WARN"}
    assert params.options == RunOptions(only=("gpu_train",), force=("gpu_train",), parent="7beaa54df3b5",
                                        trigger="rerun", reuse_parent=True)
    assert params.plan == pipeline.Plan(steps=("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train"),
                                        forced=frozenset({"gpu_train"}),
                                        reuse_only=frozenset({"npu_base_train", "convert_bf16", "convert_megatron"}))
    # that alignflow chose a step's host each time it needed it, from the recorded experiment and inventory: the
    # experiment's `hosts: {cuda: gpu-b}` among two GPU hosts, the implicit controller under the recorded state dir
    placed = params.placement
    assert {step: placed.host(step).name for step in pipeline.STEP_NAMES} == {
        "npu_base_train": "npu-a", "convert_bf16": "cpu-a", "convert_megatron": "cpu-a", "early_gate": "controller",
        "gpu_train": "gpu-b", "npu_reload_train": "npu-a", "compare": "controller", "diagnose": "controller",
        # the conversions other pipelines derive (every step any pipeline can have is placed): the cpu host too
        **{f"convert_{fmt}": "cpu-a" for fmt in ("mindformers", "torch_dist", "hf", "dcp")}}
    assert placed.host("compare").workdir == "/srv/alignflow/state/controller"
    assert store.get_run(run_id).experiment_file == "/srv/alignflow/experiments/tiny.yaml"


def test_the_first_version_1_runs_lacking_reuse_only_and_a_trigger_open_too() -> None:
    doc = json.loads(V1.read_text())
    doc["plan"].pop("reuse_only")
    doc["options"]["trigger"] = None
    params = decode_params(doc, run="0123456789ab")
    assert isinstance(params, RunParams)
    assert params.plan.reuse_only == frozenset()
    assert params.options.trigger == "cli"
    doc.pop("options")
    assert decode_params(doc, run="0123456789ab").options == RunOptions()  # type: ignore[union-attr]


def test_a_noise_run_of_version_1_is_a_noise_run_and_has_no_pipeline_to_open(store: Store, db_url: str) -> None:
    run_id = _run(store)
    _stored_as(db_url, run_id, {"runs": 3})
    run = store.get_run(run_id)
    assert run.params == NoiseRunParams(runs=3)
    assert run.experiment_file is None
    with pytest.raises(ConfigError, match=f"run {run_id} is a noise run .*, not an alignment run"):
        run.alignment_params()


def test_a_run_reads_back_as_it_was_recorded_placement_included(store: Store) -> None:
    run = store.get_run(_run(store))
    assert run.stored_params["version"] == PARAMS_VERSION
    assert run.params == run_params()
    noise = store.create_run("demo", trigger="noise", code_version="v", params=NoiseRunParams(runs=4))
    assert store.get_run(noise.id).params == NoiseRunParams(runs=4)


def test_a_recorded_placement_is_read_not_worked_out_again(store: Store, db_url: str) -> None:
    """Where a run's steps run was decided when it started; what the rules would choose now does not move them."""
    run_id = _run(store)
    doc = dict(store.get_run(run_id).stored_params)
    recorded = run_params()
    assert place(recorded.experiment, recorded.inventory, state_dir=Path("/state")).host("gpu_train").name == "cuda"
    moved = recorded.placement.model_copy(update={"hosts": {**recorded.placement.hosts,
                                                            "gpu_train": recorded.inventory.get("ascend")}})
    _stored_as(db_url, run_id, {**doc, "placement": moved.model_dump(mode="json")})
    assert store.get_run(run_id).alignment_params().placement.host("gpu_train").name == "ascend"


def test_a_step_without_a_host_keeps_why_and_says_it_when_asked() -> None:
    params = run_params()
    two_gpus = params.inventory.model_copy(update={"hosts": {
        **params.inventory.hosts, "cuda-b": params.inventory.get("cuda").model_copy(update={"name": "cuda-b"})}})
    placement = place(params.experiment, two_gpus, state_dir=Path("/state"))
    assert placement.host("npu_base_train").name == "ascend"
    with pytest.raises(ConfigError, match=r"step gpu_train needs a host with role cuda; /state/hosts.yaml has "
                                          r"several \(cuda, cuda-b\): choose one under `hosts: \{cuda: NAME\}`"):
        placement.host("gpu_train")


def test_parameters_this_alignflow_cannot_read_are_refused_naming_the_run() -> None:
    good = json.loads(V1.read_text())
    with pytest.raises(StoreError, match=r"run 0123456789ab: its parameters are of version 3, which this alignflow "
                                         r"does not read \(it reads 1 to 2\); upgrade alignflow"):
        decode_params({**good, "version": 3}, run="0123456789ab")
    bad = {**good, "experiment": {**good["experiment"], "training": {**good["experiment"]["training"], "lr": "x"}}}
    with pytest.raises(StoreError, match=r"run 0123456789ab: its recorded parameters do not read with this "
                                         r"alignflow \(training.lr: Input should be a valid number"):
        decode_params(bad, run="0123456789ab")
    with pytest.raises(StoreError, match="run 0123456789ab: its parameters name neither an experiment nor noise runs"):
        decode_params({"steps": 10}, run="0123456789ab")
