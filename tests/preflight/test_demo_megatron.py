"""The rendered demo-megatron command line is one each supported Megatron-LM accepts.

CI has no Megatron-LM checkout (its `megatron.training` imports triton), so the parser is each version's flag
table, generated from that version's real `arguments.py` by `python -m alignflow.frameworks.megatron_lm table
CHECKOUT` (kept; `tests/recipes/test_megatron_lm_args.py` regenerates it from a checkout and runs the real
`parse_args` where one is given). Beyond the parser: what each version refuses after parsing (`megatron_combos`:
kernels the host lacks, `--eval-interval`, determinism environment), and NullTokenizer's vocabulary and EOD.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.backends import TrainSpec, render_training
from alignflow.backends.commands import data_placeholder, step_command
from alignflow.config import load_experiment
from alignflow.config.experiment import Experiment
from alignflow.frameworks.megatron_lm import available, check_flags
from alignflow.preflight.megatron_combos import combination_problems
from alignflow.preflight.sides import _megatron_flags
from alignflow.twin.megatron_flags import eod_id, padded_vocab_size, parse_megatron_args

VERSIONS = ["0.16", "0.17", "0.18", "0.19"]


def demo(repo_root: Path, version: str, extensions: list[str] | None = None) -> Experiment:
    exp = load_experiment(repo_root / "experiments" / "demo-megatron.yaml")
    gpu = exp.gpu.model_copy(update={"megatron_version": version, "extensions": extensions})
    return exp.model_copy(update={"gpu": gpu})


def command_lines(exp: Experiment) -> list[tuple[str, ...]]:
    gate = TrainSpec("early_gate", "gpu", exp.gate.steps, data_placeholder(exp), "", "{in:megatron_ckpt}", None)
    gpu_train = step_command(exp, "gpu_train", data_sha256="").template
    return [_megatron_flags(exp, gpu_train.argv), _megatron_flags(exp, render_training(exp, gate).argv)]


def test_every_supported_version_has_a_table_from_its_checkout() -> None:
    assert available() == VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("extensions", [None, ["transformer_engine"], ["apex"], ["transformer_engine", "apex"]])
def test_the_rendered_demo_megatron_command_line_is_accepted(repo_root: Path, version: str,
                                                             extensions: list[str] | None) -> None:
    exp = demo(repo_root, version, extensions)
    env = step_command(exp, "gpu_train", data_sha256="").template.env
    for flags in command_lines(exp):
        accepted, why = check_flags(flags, version)
        assert accepted, why
        assert why.startswith(f"the parser of Megatron-LM core_v{version}.")
        ok, problems = combination_problems(flags, env=env, version=version, extensions=extensions)
        assert ok, problems
        assert not any(f.startswith("--twin") for f in flags)
        ns = parse_megatron_args(flags, strict=False)
        assert padded_vocab_size(ns, version)[1] == exp.model.vocab_size  # no padded rows
        assert eod_id(ns, version) == exp.model.vocab_size - 1  # the data's end-of-document id


def test_one_versions_command_line_fails_another_versions_parser(repo_root: Path) -> None:
    """The check can fail: 0.19's NullTokenizer flag does not exist in 0.16, and 0.16's flags put EOD elsewhere
    on 0.19 (254, as seen on an H200)."""
    flags19 = command_lines(demo(repo_root, "0.19"))[0]
    accepted, why = check_flags(flags19, "0.16")
    assert accepted is False
    assert "unknown flag --null-tokenizer-eod-id" in why
    flags16 = command_lines(demo(repo_root, "0.16"))[0]
    assert check_flags(flags16, "0.19")[0] is True  # it parses ...
    assert eod_id(parse_megatron_args(flags16, strict=False), "0.19") == 254  # ... but EOD is not the data's


def test_kernel_switches_follow_the_hosts_extensions(repo_root: Path) -> None:
    none = set(command_lines(demo(repo_root, "0.19", []))[0])
    te = set(command_lines(demo(repo_root, "0.19", ["transformer_engine"]))[0])
    both = set(command_lines(demo(repo_root, "0.19", ["transformer_engine", "apex"]))[0])
    assert {"--no-rope-fusion", "--no-gradient-accumulation-fusion", "--no-persist-layer-norm"} <= none
    assert "--no-rope-fusion" not in te
    assert "--no-gradient-accumulation-fusion" in te
    assert "--no-gradient-accumulation-fusion" not in both
    assert "--no-persist-layer-norm" in both  # RMSNorm: torch's norm, whatever the host has


@pytest.mark.parametrize(("drop", "extensions", "message"), [
    ("--no-rope-fusion", [], "apply_rope_fusion is not available. Please install TE >= 1.4."),
    ("--no-persist-layer-norm", ["apex"], "persist_layer_norm not supported by torch LayerNorm"),
    ("--no-gradient-accumulation-fusion", [], "fused_weight_gradient_mlp_cuda module is not found"),
    ("--eval-interval", [], "unsupported operand type(s) for //: 'int' and 'NoneType'"),
])
def test_combinations_a_version_refuses_are_refused(repo_root: Path, drop: str, extensions: list[str],
                                                    message: str) -> None:
    flags = list(command_lines(demo(repo_root, "0.19", extensions))[0])
    i = flags.index(drop)
    del flags[i:i + (2 if drop == "--eval-interval" else 1)]
    ok, problems = combination_problems(flags, env={}, version="0.19", extensions=extensions)
    assert ok is False
    assert any(message in p for p in problems), problems


def test_determinism_environment_per_version(repo_root: Path) -> None:
    flags = command_lines(demo(repo_root, "0.18"))[0]
    ok, problems = combination_problems(flags, env={}, version="0.18", extensions=None)
    assert not ok
    assert "NCCL_ALGO=None" in problems[0]
    assert combination_problems(flags, env={}, version="0.19", extensions=None)[0]  # 0.19 sets it itself
    ok, problems = combination_problems(flags, env={"NCCL_ALGO": "Tree"}, version="0.19", extensions=None)
    assert not ok
    assert "not Tree" in problems[0]
    assert combination_problems(flags, env={"NCCL_ALGO": "Tree"}, version="0.17", extensions=None)[0]


def test_transformer_engine_on_a_host_without_it_is_refused(repo_root: Path) -> None:
    exp = demo(repo_root, "0.19", [])
    exp = exp.model_copy(update={"gpu": exp.gpu.model_copy(update={"transformer_impl": "transformer_engine"})})
    flags = command_lines(exp)[0]
    ok, problems = combination_problems(flags, env={"NCCL_ALGO": "Ring"}, version="0.19", extensions=[])
    assert not ok
    assert "--transformer-impl transformer_engine on the GPU host (no Transformer Engine" in problems[0]


def test_the_hosts_file_decides_the_extensions(repo_root: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  gpu: {role: cuda, transport: local, workdir: w,\n"
                     "        cuda_extensions: [transformer_engine]}\n"
                     "  npu: {role: ascend, transport: local, workdir: w}\n  cpu: {role: cpu, transport: local, "
                     "workdir: w}\n")
    from alignflow.config import load_hosts

    exp = load_experiment(repo_root / "experiments" / "demo-megatron.yaml", load_hosts(hosts))
    assert exp.gpu.extensions == ["transformer_engine"]
    assert "--no-rope-fusion" not in command_lines(exp)[0]
    assert load_experiment(repo_root / "experiments" / "demo-megatron.yaml").gpu.extensions is None
