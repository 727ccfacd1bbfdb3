"""Preflight over rendered sides: the twin passes, the readers take MindFormers' and Megatron's semantics (aliases,
defaults, last flag wins, NullTokenizer), unreadable or unstated settings fail closed, and the CLI's exit codes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from alignflow.backends.megatron import merge_flags
from alignflow.backends.template import MegatronArgs, MindFormersYaml
from alignflow.cli import app
from alignflow.config import load_experiment
from alignflow.config.placement import place
from alignflow.errors import ConfigError
from alignflow.preflight import DataBinding, RenderedSide, check_experiment, preflight, render_sides
from alignflow.preflight.sides import SIDE_STEPS
from tests.recipes.copies import copy_twin, example_inventory, load_copy, recipe_copy


@pytest.mark.parametrize("source", ["experiments/demo.yaml", "tests/data/flow/tiny.yaml"])
def test_the_twin_experiments_pass(repo_root: Path, source: str) -> None:
    report = check_experiment(load_experiment(repo_root / source))
    assert report.ok, report.summary()
    settings = {f.setting for f in report.findings}
    assert {"data.file", "data.seed", "model.vocab_size", "moe.renormalize", "mtp.loss_scale",
            "det.deterministic"} <= settings
    # determinism env is a real-backend requirement: the twin on CPU is not held to HCCL/NVTE variables
    assert not {"det.hccl", "det.nvte"} & settings


def test_a_twin_bug_is_found_on_the_twin_too(repo_root: Path, tmp_path: Path) -> None:
    path = copy_twin(repo_root, tmp_path, edits={"gpu.extra_args": ["--seed", "42"]})
    report = check_experiment(load_experiment(path))
    assert {f.setting for f in report.mismatches} == {"data.seed", "train.init_seed"}


def test_the_twin_data_fingerprints_must_agree(repo_root: Path, tmp_path: Path) -> None:
    path = copy_twin(repo_root, tmp_path, edits={"gpu.env": {"ALIGNFLOW_TWIN_DATA_SHA256": "ab" * 32}})
    report = check_experiment(load_experiment(path), data_sha256="cd" * 32)
    line = next(f.line() for f in report.mismatches)
    assert f"NPU {'cd' * 32} (twin.data_sha256)" in line
    assert f"GPU {'ab' * 32} (ALIGNFLOW_TWIN_DATA_SHA256 (command env; no hosts file given))" in line


def test_alignflow_overrides_in_the_template_cannot_cause_a_mismatch(repo_root: Path, tmp_path: Path) -> None:
    # the template's own seed, data seed, shuffle and step count are replaced by the experiment's at render time
    path = recipe_copy(repo_root, tmp_path, "qwen35_dense", template={
        "training.seed": 42, "training.steps": 7, "train_dataset.dataloader.config.seed": 42,
        "train_dataset.dataloader.shuffle": True, "checkpoint.no_load_optim": False})
    assert check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root)).ok


def test_a_model_key_the_template_does_not_write_fails_closed(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", template={"model.rms_norm_eps": None,
                                                                     "model.hidden_dropout": None})
    report = check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root))
    lines = {f.setting: f.line() for f in report.mismatches}
    assert set(lines) == {"model.norm_epsilon", "model.hidden_dropout"}
    assert "model.rms_norm_eps / model.layernorm_epsilon unset; no documented default — write it in the template" \
        in lines["model.norm_epsilon"]


def test_two_spellings_with_different_values_are_reported_not_guessed(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "qwen35_dense", template={"model.num_layers": 4})
    report = check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root))
    line = next(f.line() for f in report.mismatches if f.setting == "model.num_layers")
    assert "conflicting spellings model.num_hidden_layers=8, model.num_layers=4; keep one" in line


def test_moe_on_one_side_only_is_one_finding_not_one_per_moe_setting(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "qwen35_moe", template={"model.num_experts": None})
    report = check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root))
    assert [f.setting for f in report.mismatches] == ["moe.num_experts"]
    assert "NPU 0 (model.n_routed_experts / model.num_experts / model.num_moe_experts unset: none) vs GPU 8 " \
           "(--num-experts)" in report.mismatches[0].line()


Rendered = tuple[RenderedSide, RenderedSide, DataBinding]


def _sides(config: dict[str, object], argv: list[str]) -> Rendered:
    npu = RenderedSide("npu", "mindformers", MindFormersYaml(config, "mindformers", "test yaml"),
                       {"HCCL_DETERMINISTIC": "true"}, "test", "test yaml", role="ascend")
    gpu = RenderedSide("gpu", "megatron", MegatronArgs(tuple(argv), "0.16", None, real=True),
                       {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "NCCL_ALGO": "Ring"}, "test", "test argv")
    return npu, gpu, DataBinding("ef" * 32, {"ascend": "/data/npu/ds", "cuda": "/data/gpu/ds"})


def _with_argv(side: RenderedSide, argv: tuple[str, ...]) -> RenderedSide:
    """The side with another Megatron command line (everything else as rendered)."""
    assert isinstance(side.rendered, MegatronArgs)
    return replace(side, rendered=replace(side.rendered, argv=argv))


@pytest.fixture
def rendered(repo_root: Path) -> Rendered:
    inventory = example_inventory(repo_root)
    exp = load_experiment(repo_root / "experiments" / "qwen35_moe.yaml", inventory)
    return render_sides(exp, placement=place(exp, inventory, steps=SIDE_STEPS))


def test_the_last_occurrence_of_a_flag_wins_as_in_megatron(rendered: Rendered) -> None:
    npu, gpu, data = rendered
    twice = _with_argv(gpu, (*gpu.argv, "--lr", "1e-3", "--lr", "3e-4"))
    assert preflight(npu, twice, data).ok


def test_warmup_fraction_is_a_fraction_of_the_decay_steps(rendered: Rendered) -> None:
    npu, gpu, data = rendered
    argv = [a for a in gpu.argv]
    i = argv.index("--lr-warmup-iters")
    del argv[i:i + 2]
    frac = _with_argv(gpu, (*argv, "--lr-warmup-fraction", "0.01"))
    report = preflight(npu, frac, data)
    assert report.ok
    assert next(f for f in report.findings if f.setting == "opt.warmup_steps").gpu.source == \
        "--lr-warmup-fraction x decay steps"  # type: ignore[union-attr]


def test_a_tokenizer_whose_vocabulary_preflight_cannot_read_fails_closed(
    rendered: Rendered,
) -> None:
    npu, gpu, data = rendered
    hf = _with_argv(gpu, (*gpu.argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/tok"))
    report = preflight(npu, hf, data)
    assert [f.setting for f in report.mismatches] == ["model.vocab_size"]
    assert "--tokenizer-type HuggingFaceTokenizer: the vocabulary comes from the tokenizer files" in \
        report.mismatches[0].line()


def test_a_stated_padded_vocabulary_is_taken_as_is(rendered: Rendered) -> None:
    npu, gpu, data = rendered
    stated = _with_argv(gpu, (*gpu.argv, "--padded-vocab-size", "248448"))
    report = preflight(npu, stated, data)
    assert [f.setting for f in report.mismatches] == ["model.vocab_size"]
    assert "GPU 248448 (--padded-vocab-size)" in report.mismatches[0].line()


def test_data_already_on_the_hosts_is_the_experiments_data(rendered: Rendered) -> None:
    npu, gpu, _ = rendered
    config = yaml.safe_load(yaml.safe_dump(dict(npu.config)))
    config["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", "/data/npu/ds/qwen35_moe_text_document"]
    argv = merge_flags(list(gpu.argv), ["--data-path", "/data/gpu/ds/qwen35_moe_text_document"])
    npu2, gpu2, data = _sides(config, argv)
    assert preflight(npu2, gpu2, data).ok
    # the same directory but another prefix is another file
    argv = merge_flags(list(gpu.argv), ["--data-path", "/data/gpu/ds/other_text_document"])
    report = preflight(*_sides(config, argv))
    assert [f.setting for f in report.mismatches] == ["data.file"]


def test_preflight_is_pure(rendered: Rendered) -> None:
    first = preflight(*rendered).to_dict()
    assert preflight(*rendered).to_dict() == first
    assert json.loads(json.dumps(first)) == first  # JSON-safe as is


def test_extra_args_replace_generated_flags_instead_of_repeating_them(repo_root: Path, tmp_path: Path) -> None:
    assert merge_flags(["--lr", "1e-5", "--swiglu", "--data-path", "1", "a"], ["--data-path", "b", "--lr", "2"]) \
        == ["--swiglu", "--data-path", "b", "--lr", "2"]
    path = recipe_copy(repo_root, tmp_path, "qwen35_dense", experiment={"gpu.extra_args+": ["--seed", "7"]})
    _, gpu, _ = render_sides(load_copy(path, repo_root))
    assert gpu.argv.count("--seed") == 1
    assert gpu.argv[gpu.argv.index("--seed") + 1] == "7"


def test_a_replaced_gpu_command_cannot_be_read_and_says_so(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "glm52_mini",
                       experiment={"steps": {"gpu_train": {"command": ["bash", "-c", "train.sh"]}}})
    # glm52 declares a Megatron fix: the step runs pretrain_gpt.py through its launcher
    with pytest.raises(ConfigError, match=r"the gpu_train command does not run \{out\}/megatron_launch.py"):
        render_sides(load_copy(path, repo_root))


def test_cli_exit_codes_table_and_json(repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)
    runner = CliRunner()
    ok = runner.invoke(app, ["preflight", "qwen35_moe", "--hosts", "hosts.ssh.example.yaml"])
    assert ok.exit_code == 0, ok.output
    assert "alignment-critical settings agree" in ok.output
    bad_path = recipe_copy(repo_root, tmp_path, "qwen35_moe", template={"model.norm_topk_prob": False})
    bad = runner.invoke(app, ["preflight", str(bad_path), "--hosts", "hosts.ssh.example.yaml"])
    assert bad.exit_code == 1
    assert "top-k renormalisation" in bad.output
    as_json = runner.invoke(app, ["preflight", str(bad_path), "--json"])
    assert as_json.exit_code == 1
    doc = json.loads(as_json.output)
    assert doc["ok"] is False
    assert doc["mismatches"] == 1
    (finding,) = [f for f in doc["findings"] if f["status"] == "mismatch"]
    assert finding["npu"] == {"value": False, "shown": "False", "source": "model.norm_topk_prob"}
    assert finding["gpu"]["value"] is True
    everything = runner.invoke(app, ["preflight", "qwen35_moe", "--all"])
    assert everything.exit_code == 0
    assert "routed experts" in everything.output
