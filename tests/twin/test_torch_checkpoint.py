"""Megatron legacy checkpoints on the PyTorch side: flavours, MTP naming, and Megatron's load behaviour."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from alignflow.errors import ConfigError  # noqa: E402
from alignflow.twin.flavours import megatron_layout, mtp_inner_name, parse_version  # noqa: E402
from alignflow.twin.presets import preset, twin_spec  # noqa: E402
from alignflow.twin.torch_checkpoint import TRACKER, load_checkpoint, save_checkpoint  # noqa: E402
from alignflow.twin.torch_model import TwinGPTTorch  # noqa: E402


def _model(name: str = "twin-moe", version: str = "0.16", seed: int = 0) -> TwinGPTTorch:
    torch.manual_seed(seed)
    return TwinGPTTorch(twin_spec(preset(name)), mtp_inner_name=mtp_inner_name(version))


def _save(model: TwinGPTTorch, root: Path, flavour: str = "local") -> Path:
    layout = megatron_layout(model.state_dict(), flavour)  # type: ignore[arg-type]
    return save_checkpoint(model, root, 1, layout, optimizer=None, microseconds=True, now=datetime.now)


def test_mtp_inner_layer_name_follows_the_megatron_core_version() -> None:
    assert mtp_inner_name("0.16") == mtp_inner_name("0.16.1") == "transformer_layer"
    assert mtp_inner_name("0.17") == mtp_inner_name("core_r0.19.0") == "mtp_model_layer"
    assert "mtp.layers.0.mtp_model_layer.mlp.router.weight" in _model(version="0.19").state_dict()
    with pytest.raises(ConfigError):
        parse_version("latest")


def test_transformer_engine_names_are_the_contract_s() -> None:
    layout = megatron_layout(_model().state_dict(), "transformer_engine")
    m = layout.to_checkpoint
    assert m["decoder.layers.0.input_layernorm.weight"] == (
        "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight")
    assert m["decoder.layers.0.pre_mlp_layernorm.weight"] == "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"
    assert m["decoder.layers.1.pre_mlp_layernorm.weight"] == "decoder.layers.1.pre_mlp_layernorm.weight"  # MoE keeps it
    assert m["decoder.layers.2.mlp.experts.local_experts.3.linear_fc2.weight"] == (
        "decoder.layers.2.mlp.experts.linear_fc2.weight3")
    assert m["mtp.layers.0.transformer_layer.input_layernorm.weight"] == (
        "mtp.layers.0.transformer_layer.self_attention.linear_qkv.layer_norm_weight")
    assert {"decoder.layers.0.self_attention.core_attention._extra_state",
            "decoder.layers.1.mlp.experts.linear_fc1._extra_state",
            "decoder.layers.3.mlp.shared_experts.linear_fc2._extra_state"} <= layout.required_extra
    assert not any(k.startswith("decoder.layers.1.mlp.linear_fc1") for k in layout.required_extra)
    assert {"decoder.layers.1.pre_mlp_layernorm._extra_state", "decoder.final_layernorm._extra_state",
            "mtp.layers.0.enorm._extra_state"} <= layout.required_extra  # TENorms (tests/data/keysets/)
    assert len(layout.required_extra) == 41  # 33 TE linears and attention + 8 TENorms


@pytest.mark.parametrize("flavour", ["local", "transformer_engine"])
def test_saved_checkpoints_load_strictly_with_weights_only(tmp_path: Path, flavour: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    source, target = _model(seed=1), _model(seed=2)
    path = _save(source, tmp_path, flavour)
    state = torch.load(path, weights_only=True)
    assert state["checkpoint_version"] == 3.0
    assert state["iteration"] == 1
    assert (tmp_path / TRACKER).read_text() == "1"
    layout = megatron_layout(target.state_dict(), flavour)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO):
        result = load_checkpoint(target, tmp_path, layout, finetune=True, where="t")
    assert result.strict
    assert result.iteration == 0
    assert "load_return:" not in caplog.text
    assert f"  successfully loaded checkpoint from {tmp_path} [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 0" in (
        caplog.text)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name


def test_a_missing_key_falls_back_to_a_non_strict_load_like_megatron(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    source, target = _model(seed=1), _model(seed=2)
    path = _save(source, tmp_path)
    state = torch.load(path, weights_only=True)
    del state["model"]["decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"]
    torch.save(state, path)
    layout = megatron_layout(target.state_dict(), "local")
    with caplog.at_level(logging.INFO):
        result = load_checkpoint(target, tmp_path, layout, finetune=True, where="t")
    assert "load_return: None" in caplog.text  # and the run goes on, as Megatron's does
    assert result.missing == ("decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight",)
    kept = target.decoder.layers[1].mlp.experts.local_experts[0].linear_fc2.weight  # type: ignore[union-attr]
    assert not torch.equal(kept, source.state_dict()["decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"])


def test_wrong_megatron_version_names_leave_the_mtp_layer_random(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    _save(_model(version="0.17"), tmp_path)
    target = _model(version="0.16")
    with caplog.at_level(logging.INFO):
        result = load_checkpoint(target, tmp_path, megatron_layout(target.state_dict(), "local"), finetune=True,
                                 where="t")
    assert "load_return: None" in caplog.text
    assert all(".transformer_layer." in k for k in result.missing)
    assert all(".mtp_model_layer." in k for k in result.unexpected)


def test_a_shape_mismatch_is_fatal(tmp_path: Path) -> None:
    _save(_model(), tmp_path)
    torch.manual_seed(0)
    model = preset().model_copy(update={"vocab_size": 384})
    target = TwinGPTTorch(twin_spec(model))
    with pytest.raises(ConfigError, match=r"size mismatch for embedding\.word_embeddings\.weight"):
        load_checkpoint(target, tmp_path, megatron_layout(target.state_dict(), "local"), finetune=True, where="t")


@pytest.mark.parametrize(("setup", "message"), [
    (lambda p: None, "is not a directory"),
    (lambda p: p.mkdir(), "has no latest_checkpointed_iteration.txt"),
    (lambda p: (p.mkdir(), (p / TRACKER).write_text("latest")), "invalid metadata file"),
    (lambda p: (p.mkdir(), (p / TRACKER).write_text("7")), "does not exist"),
])
def test_missing_checkpoints_are_errors_not_random_inits(tmp_path: Path, setup: object, message: str) -> None:
    root = tmp_path / "ckpt"
    setup(root)  # type: ignore[operator]
    model = _model()
    with pytest.raises(ConfigError, match=message):
        load_checkpoint(model, root, megatron_layout(model.state_dict(), "local"), finetune=True, where="t")
