"""Both entry points, run as the pipeline runs them, reject bad input clearly and keep Megatron's silent failure."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from alignflow.errors import SentinelError
from alignflow.logs import check_sentinels, parse_log
from alignflow.twin.presets import preset
from alignflow.twin.render import mindformers_config

from .conftest import TwinData, run_mindspore, run_torch, torch_argv, training

pytestmark = pytest.mark.slow


def _megatron_checkpoint(root: Path, *, drop: str | None = None) -> Path:
    """A Megatron legacy checkpoint of the twin (local flavour), written by the twin itself."""
    import torch

    from alignflow.twin.flavours import megatron_layout
    from alignflow.twin.presets import twin_spec
    from alignflow.twin.torch_checkpoint import save_checkpoint
    from alignflow.twin.torch_model import TwinGPTTorch

    torch.manual_seed(0)
    model = TwinGPTTorch(twin_spec(preset()))
    path = save_checkpoint(model, root, 1, megatron_layout(model.state_dict(), "local"), optimizer=None,
                           microseconds=True, now=datetime.now)
    if drop is not None:
        state = torch.load(path, weights_only=True)
        del state["model"][drop]
        torch.save(state, path)
    return root


def _ms_cfg(data: TwinData, **kw: object) -> dict[str, object]:
    args: dict[str, object] = dict(data_path=str(data.path), data_sha256=data.sha256, load_path=None,
                                   save_path=None, steps=2, jit=False)
    args.update(kw)
    return mindformers_config(preset(), training(2), **args)  # type: ignore[arg-type]


def test_mindspore_missing_checkpoint_is_an_error(tmp_path: Path, twin_data: TwinData,
                                                  subprocess_env: dict[str, str]) -> None:
    run = run_mindspore(_ms_cfg(twin_data, load_path=str(tmp_path / "nowhere")), tmp_path, subprocess_env)
    assert run.returncode == 2  # a configuration error (ConfigError's exit code)
    assert "checkpoint.load_path" in run.stdout
    assert "does not exist" in run.stdout
    assert "step:[" not in run.stdout


def test_mindspore_wrong_data_sha256_is_an_error(tmp_path: Path, twin_data: TwinData,
                                                 subprocess_env: dict[str, str]) -> None:
    run = run_mindspore(_ms_cfg(twin_data, data_sha256="0" * 64), tmp_path, subprocess_env)
    assert run.returncode == 1
    assert f"has sha256 {twin_data.sha256}, but {'0' * 64} was declared" in run.stdout


def test_mindspore_unknown_key_is_an_error(tmp_path: Path, twin_data: TwinData,
                                           subprocess_env: dict[str, str]) -> None:
    cfg = _ms_cfg(twin_data)
    cfg["checkpoint"]["load_checkpoint"] = "old-style key"  # type: ignore[index]
    run = run_mindspore(cfg, tmp_path, subprocess_env)
    assert run.returncode == 2  # a configuration error (ConfigError's exit code)
    assert "twin.yaml:" in run.stdout
    assert "checkpoint.load_checkpoint: unknown key" in run.stdout


def test_mindspore_refuses_a_checkpoint_missing_network_parameters(tmp_path: Path, twin_data: TwinData,
                                                                   ms_base: Path,
                                                                   subprocess_env: dict[str, str]) -> None:
    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    source = ms_base / "iteration_00000004"
    (partial / "iteration_00000004").mkdir(parents=True)
    (partial / "latest_checkpointed_iteration.txt").write_text("4")
    (partial / "iteration_00000004" / "common.json").write_text((source / "common.json").read_text())
    tensors = load_file(source / "checkpoint-model-0000000-0000001.safetensors")
    del tensors["decoder.layers.2.mlp.experts.weight1"]
    save_file(tensors, partial / "iteration_00000004" / "checkpoint-model-0000000-0000001.safetensors")
    run = run_mindspore(_ms_cfg(twin_data, load_path=str(partial)), tmp_path, subprocess_env)
    assert run.returncode == 2  # a configuration error (ConfigError's exit code)
    assert "Network parameters not loaded:" in run.stdout
    assert "  - decoder.layers.2.mlp.experts.weight1" in run.stdout
    assert "step:[" not in run.stdout


def test_torch_missing_checkpoint_is_an_error(tmp_path: Path, twin_data: TwinData,
                                              subprocess_env: dict[str, str]) -> None:
    (tmp_path / "empty").mkdir()
    run = run_torch(torch_argv(twin_data, load=tmp_path / "empty", steps=2), tmp_path, subprocess_env,
                    data=twin_data)
    assert run.returncode == 2  # a configuration error (ConfigError's exit code)
    assert "has no latest_checkpointed_iteration.txt" in run.stderr
    assert "iteration " not in run.stdout


def test_torch_wrong_data_sha256_and_unknown_flags_are_errors(tmp_path: Path, twin_data: TwinData,
                                                              subprocess_env: dict[str, str]) -> None:
    run = run_torch(torch_argv(twin_data, load=None, steps=2), tmp_path, subprocess_env, sha256="f" * 64)
    assert run.returncode == 1
    assert f"but {'f' * 64} was declared" in run.stderr
    run = run_torch([*torch_argv(twin_data, load=None, steps=2), "--recompute-activations"], tmp_path, subprocess_env,
                    data=twin_data)
    assert run.returncode == 2  # a configuration error (ConfigError's exit code)
    assert "unknown flag '--recompute-activations'" in run.stderr


def test_torch_refuses_a_flag_its_megatron_version_does_not_have(tmp_path: Path, twin_data: TwinData,
                                                                 subprocess_env: dict[str, str]) -> None:
    # --null-tokenizer-eod-id arrived in megatron-core 0.18: real 0.16 would stop at argparse, so the twin does too
    argv = torch_argv(twin_data, load=None, steps=1, megatron_version="0.19")
    assert "--null-tokenizer-eod-id" in argv
    run = run_torch(argv, tmp_path, subprocess_env, data=twin_data, version="0.16")
    assert run.returncode == 2  # a configuration error (ConfigError's exit code)
    assert "real Megatron-LM would not start: the parser of Megatron-LM core_v0.16.1" in run.stderr
    assert "unknown flag --null-tokenizer-eod-id" in run.stderr
    run = run_torch(argv, tmp_path, subprocess_env, data=twin_data, version="0.19")
    assert run.returncode == 0, run.stderr


def test_torch_missing_key_is_megatron_s_silent_fallback_and_the_sentinel_catches_it(
        tmp_path: Path, twin_data: TwinData, subprocess_env: dict[str, str]) -> None:
    ckpt = _megatron_checkpoint(tmp_path / "mg", drop="decoder.layers.1.mlp.router.weight")
    run = run_torch(torch_argv(twin_data, load=ckpt, steps=2), tmp_path, subprocess_env,
                    data=twin_data)
    assert run.returncode == 0, run.stderr  # as Megatron: the run "succeeds"
    assert "load_return: None" in run.stdout
    parsed = parse_log(run.lines, source="gpu.log")
    assert parsed.steps == [1, 2]
    with pytest.raises(SentinelError, match="load_return"):
        check_sentinels(parsed)


def test_torch_checkpoint_that_matches_loads_cleanly(tmp_path: Path, twin_data: TwinData,
                                                     subprocess_env: dict[str, str]) -> None:
    ckpt = _megatron_checkpoint(tmp_path / "mg")
    run = run_torch(torch_argv(twin_data, load=ckpt, steps=2), tmp_path, subprocess_env,
                    data=twin_data)
    assert run.returncode == 0, run.stderr
    check_sentinels(parse_log(run.lines, source="gpu.log"), require=("checkpoint_loaded",))
