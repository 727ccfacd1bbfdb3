"""Whole runs whose steps follow the checkpoint formats, on the embedded default's local hosts (real processes):
two Megatron-kind sides with no conversion step — one of them a `command` side running the PyTorch twin from a
launch template —, and two sides starting from a Hugging Face checkpoint written by transformers' own Qwen3 class."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from alignflow.backends.commands import step_command
from alignflow.config import load_experiment
from alignflow.logs.parse import parse_log_file
from alignflow.runner.run import execute_pipeline, start_run
from alignflow.store import Store
from alignflow.transport import open_transport
from tests.preflight.test_runner import local_hosts
from tests.recipes.copies import copy_twin

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _run(experiment: Path, tmp_path: Path) -> tuple[object, dict[str, str], Path]:
    state = tmp_path / "state"
    with Store.open(state_dir=state) as store:
        run_id = start_run(experiment, local_hosts(tmp_path), store=store, state_dir=state)
        view = execute_pipeline(run_id, store=store, state_dir=state, transport_factory=open_transport)
        steps = {s.step: s.status for s in store.steps(run_id)}
    return view, steps, state / "runs" / run_id / "logs"


def _command_from_twin(experiment: Path) -> dict[str, object]:
    """The PyTorch twin's own gpu_train command, written as a launch template (what a user writes for a trainer of
    their own): the checkpoint, data, step count and seed are the pipeline's placeholders."""
    exp = load_experiment(experiment)
    template = step_command(exp, "gpu_train", data_sha256="{data_sha256}").template
    argv = list(template.argv)
    for flag, placeholder in (("--load", "{load}"), ("--data-path", "{data}"), ("--train-iters", "{steps}"),
                              ("--seed", "{seed}")):
        argv[argv.index(flag) + 1] = placeholder
    return {"kind": "command", "launch": argv, "env": dict(template.env), "log": {"format": "megatron"},
            "checkpoint": {"loads": "megatron"}, "loaded_line": "successfully loaded checkpoint from"}


def test_megatron_against_a_command_side_runs_with_no_conversion_and_passes(
        repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the local jobs inherit it: see tests.flows.conftest.LOCAL_HOST_ENV
    twins = copy_twin(repo_root, tmp_path / "exp", edits={"npu": {"kind": "twin-torch"},
                                                           "gpu": {"kind": "twin-torch"}, "conversion": None})
    data = yaml.safe_load(twins.read_text())
    data["gpu"] = _command_from_twin(twins)
    twins.write_text(yaml.safe_dump(data, sort_keys=False))
    view, steps, logs = _run(twins, tmp_path)
    assert view.status == "completed", view.error  # type: ignore[attr-defined]
    assert view.verdict == "pass"  # type: ignore[attr-defined]
    # a command side is a real trainer: the early gate runs by default, from the one base checkpoint
    assert steps == {"npu_base_train": "ran", "early_gate": "ran", "gpu_train": "ran", "npu_reload_train": "ran",
                     "compare": "ran"}
    npu, gpu = parse_log_file(logs / "npu_reload_train.log"), parse_log_file(logs / "gpu_train.log")
    # one base checkpoint, the same trainer and data on both sides: the curves are the same numbers
    assert npu.frame["lm_loss"].tolist() == gpu.frame["lm_loss"].tolist()
    assert len(npu.frame) == 8


def test_both_sides_train_from_a_transformers_qwen3_checkpoint_and_pass(
        repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the local jobs inherit it: see tests.flows.conftest.LOCAL_HOST_ENV
    qwen3 = {"family": "qwen3", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
             "num_query_groups": 2, "kv_channels": 16, "vocab_size": 256, "seq_length": 32, "rotary_base": 10000,
             "norm_epsilon": 1.0e-6, "qk_layernorm": True}
    experiment = copy_twin(repo_root, tmp_path / "exp", edits={
        "model": qwen3, "conversion": {"spec": "qwen3"},
        "base": {"path": "base/qwen3-hf", "format": "hf", "generate": {"seed": 0}}})
    view, steps, logs = _run(experiment, tmp_path)
    assert view.status == "completed", view.error  # type: ignore[attr-defined]
    assert view.verdict == "pass"  # type: ignore[attr-defined]
    assert steps == {"convert_mindformers": "ran", "convert_megatron": "ran", "gpu_train": "ran",
                     "npu_reload_train": "ran", "compare": "ran"}
    made = tmp_path / "exp" / "base" / "qwen3-hf"
    assert "Qwen3ForCausalLM" in (made / "config.json").read_text()  # transformers' own save_pretrained
    npu, gpu = parse_log_file(logs / "npu_reload_train.log"), parse_log_file(logs / "gpu_train.log")
    # MindSpore and PyTorch from the same converted weights: step 1 (a forward pass, no update yet) agrees closely
    assert abs(npu.frame["lm_loss"].iloc[0] - gpu.frame["lm_loss"].iloc[0]) < 5e-5 * gpu.frame["lm_loss"].iloc[0]
