"""The experiment's `gpu.parallel` picks the Megatron checkpoint: what `convert_megatron` writes, what `gpu_train`
loads (`--ckpt-format`), and preflight's refusal of a layout that cannot load it. Rendering only: no process.

demo-megatron at `{tp: 2, pp: 2}` and `{tp: 2, ep: 2, dp: 2}` renders the torchrun commands of real Megatron-LM
that the multi-GPU proof (issue 38) runs as `alignflow render ... gpu_train --script` prints them; their flags are
checked against Megatron-LM core_v0.19's own argument table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.backends.commands import step_command
from alignflow.config import load_experiment
from alignflow.config.experiment import StepConfig
from alignflow.config.model import ModelConfig
from alignflow.config.parallel import ParallelConfig
from alignflow.convert.layout import checkpoint_load_problems, megatron_checkpoint_layout
from alignflow.convert.sharding import layout_problems, rank_file_dir
from alignflow.errors import ConfigError
from alignflow.frameworks.megatron_lm import check_flags
from alignflow.preflight import check_experiment

ONE = ParallelConfig()


def _demo_megatron(repo_root: Path, tmp_path: Path, layout: str, conversion: str = "") -> Path:
    """demo-megatron with `gpu.parallel: <layout>` (and micro batches of 2 when dp is 2: the global batch of 4 must
    be micro batch x dp x accumulation on each side)."""
    text = (repo_root / "experiments" / "demo-megatron.yaml").read_text()
    text = text.replace("  torchrun: {nproc_per_node: 1}\n", f"  parallel: {layout}\n")
    if "dp: 2" in layout:
        text = text.replace("  micro_batch_size: 4\n", "  micro_batch_size: 2\n")
    text = text.replace("path: ../.alignflow/data/demo", f"path: {repo_root}/.alignflow/data/demo")
    if conversion:
        text = text.replace("conversion:\n  spec: twin-moe", f"conversion:\n  spec: twin-moe\n{conversion}")
    path = tmp_path / "demo-megatron.yaml"
    path.write_text(text)
    return path


def test_the_gpu_layout_picks_the_checkpoint_format_and_files() -> None:
    assert megatron_checkpoint_layout("auto", ONE) == ("torch", ONE)
    assert megatron_checkpoint_layout("auto", ParallelConfig(tp=2)) == ("torch_dist", ONE)
    assert megatron_checkpoint_layout("torch", ParallelConfig(tp=2, pp=2)) == ("torch", ParallelConfig(tp=2, pp=2))
    assert megatron_checkpoint_layout("torch", ParallelConfig(ep=2, dp=2)) == ("torch", ParallelConfig(ep=2, dp=2))
    assert megatron_checkpoint_layout("torch_dist", ONE) == ("torch_dist", ONE)
    assert rank_file_dir(1, 0, 0, ParallelConfig(tp=2)) == "mp_rank_01"
    assert rank_file_dir(1, 1, 0, ParallelConfig(tp=2, pp=2)) == "mp_rank_01_001"
    assert rank_file_dir(0, 0, 1, ParallelConfig(ep=2, dp=2)) == "mp_rank_00_001"
    assert rank_file_dir(1, 1, 1, ParallelConfig(tp=2, pp=2, ep=2, dp=2)) == "mp_rank_01_001_001"


@pytest.mark.parametrize(("layout", "nproc", "flags"), [
    ("{tp: 2, pp: 2}", 4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    ("{tp: 2, ep: 2, dp: 2}", 4, ["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2"]),
])
def test_demo_megatron_at_a_multi_gpu_layout_renders_torchrun_of_megatron_lm_loading_torch_dist(
        repo_root: Path, tmp_path: Path, layout: str, nproc: int, flags: list[str]) -> None:
    exp = load_experiment(_demo_megatron(repo_root, tmp_path, layout))
    argv = step_command(exp, "gpu_train", data_sha256="").template.argv
    assert argv[:5] == ("{python}", "-m", "torch.distributed.run", "--nproc_per_node", str(nproc))
    entry = argv.index("/opt/Megatron-LM/pretrain_gpt.py")
    megatron = list(argv[entry + 1:])
    assert megatron[megatron.index("--ckpt-format") + 1] == "torch_dist"
    assert megatron[megatron.index("--load") + 1] == "{in:megatron_ckpt}"
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        assert megatron[megatron.index(flag) + 1] == value
    accepted, why = check_flags(megatron, "0.19")
    assert accepted, why
    convert = step_command(exp, "convert_megatron", data_sha256="").template.argv
    assert convert[convert.index("--ckpt-format") + 1] == "torch_dist"
    assert "--tp" not in convert  # a torch_dist checkpoint is the same for every layout
    report = check_experiment(exp)
    assert report.ok, report.summary()


def test_legacy_files_follow_the_layout_and_preflight_refuses_another(repo_root: Path, tmp_path: Path) -> None:
    exp = load_experiment(_demo_megatron(repo_root, tmp_path, "{tp: 2, pp: 2}", "  format: torch"))
    convert = step_command(exp, "convert_megatron", data_sha256="").template.argv
    assert convert[convert.index("--tp") + 1] == "2"
    assert convert[convert.index("--pp") + 1] == "2"
    gpu = step_command(exp, "gpu_train", data_sha256="").template.argv
    assert gpu[gpu.index("--ckpt-format") + 1] == "torch"
    assert check_experiment(exp).ok
    # a convert_megatron step that writes files for another layout: the GPU training cannot load them
    other = [*convert[: convert.index("--tp")], "--tp", "1", "--pp", "2", "--json"]
    override = exp.model_copy(update={"steps": {**exp.steps, "convert_megatron": StepConfig(command=other)}})
    report = check_experiment(override)
    assert not report.ok
    assert "legacy files for tp 1 pp 2 ep 1, the training runs tp 2 pp 2 ep 1" in report.summary()


def test_preflight_refuses_a_layout_megatron_core_cannot_build_for_the_model(repo_root: Path, tmp_path: Path) -> None:
    exp = load_experiment(_demo_megatron(repo_root, tmp_path, "{tp: 4}"))
    summary = check_experiment(exp).summary()
    assert "the layout loads the checkpoint it is given" in summary  # the rule of any Megatron-kind side
    assert "model.num_query_groups 2 is not divisible by tp 4" in summary
    assert "vocab_size 256 pads to 512 at tp 4" in summary


def test_layout_problems_are_megatron_cores_divisibility_rules() -> None:
    model = ModelConfig(family="twin-moe", num_layers=3, hidden_size=96, ffn_hidden_size=210, num_attention_heads=6,
                        num_query_groups=3, vocab_size=384, make_vocab_size_divisible_by=128, seq_length=8,
                        moe={"num_experts": 3, "router_topk": 1, "ffn_hidden_size": 30})
    assert layout_problems(model, ParallelConfig(tp=3, dp=1)) == []
    got = layout_problems(model, ParallelConfig(tp=2, pp=2, ep=2, dp=2))
    assert got == [
        "model.num_query_groups 3 is not divisible by tp 2",
        "model.num_layers 3 is not divisible by pp 2",
        "model.moe.num_experts 3 is not divisible by ep 2",
        "vocab_size 384 pads to 512 at tp 2 (a multiple of make_vocab_size_divisible_by 128 x tp): another "
        "embedding than the checkpoint's",
    ]


def test_a_checkpoint_loads_only_where_megatron_lm_would_load_it() -> None:
    tp2 = ParallelConfig(tp=2)
    assert checkpoint_load_problems(("torch_dist", ONE), ("torch_dist", tp2)) == []
    assert checkpoint_load_problems(("torch", tp2), ("torch", tp2)) == []
    assert checkpoint_load_problems(("torch", ONE), ("torch", tp2)) == [
        "legacy files for tp 1 pp 1 ep 1, the training runs tp 2 pp 1 ep 1: a legacy checkpoint loads only at its "
        "own layout (use torch_dist)"]
    assert checkpoint_load_problems(("torch_dist", ONE), ("torch", ONE)) == [
        "the checkpoint is torch_dist, the training loads --ckpt-format torch"]


def test_the_twin_refuses_expert_parallelism_at_render(repo_root: Path) -> None:
    exp = load_experiment(repo_root / "experiments" / "demo.yaml")
    bad = exp.model_copy(update={"gpu": exp.gpu.model_copy(update={"parallel": ParallelConfig(ep=2, dp=2)})})
    with pytest.raises(ConfigError, match="not expert parallelism"):
        step_command(bad, "gpu_train", data_sha256="")
    ok = exp.model_copy(update={"gpu": exp.gpu.model_copy(update={"parallel": ParallelConfig(tp=2, pp=2)})})
    argv = step_command(ok, "gpu_train", data_sha256="").template.argv
    assert argv[argv.index("--ckpt-format") + 1] == "torch_dist"
    assert argv[argv.index("--tensor-model-parallel-size") + 1] == "2"
