from __future__ import annotations

import pytest

from alignflow.backends.twin import megatron_args
from alignflow.errors import ConfigError
from alignflow.twin.megatron_flags import (
    eod_id,
    model_config_from_megatron,
    moe_layer_pattern,
    padded_vocab_size,
    parse_megatron_args,
)
from alignflow.twin.presets import PRESETS, preset, twin_spec

from .conftest import training


def _argv(name: str = "twin-moe", **kw: object) -> list[str]:
    return megatron_args(preset(name), training(30), data_path="data/d", load=None, save=None,
                         steps=30, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_rendered_flags_read_back_as_the_same_model(name: str) -> None:
    ns = parse_megatron_args(_argv(name))
    back = model_config_from_megatron(ns, family=name)
    assert twin_spec(back) == twin_spec(preset(name))


@pytest.mark.parametrize("version", ["0.16", "0.17"])
def test_null_tokenizer_up_to_0_17_adds_one_id_before_padding(version: str) -> None:
    ns = parse_megatron_args(_argv(megatron_version=version))
    assert (ns.vocab_size, ns.null_tokenizer_eod_id) == (255, None)
    assert padded_vocab_size(ns, version) == (256, 256)
    assert eod_id(ns, version) == 255  # the data's end-of-document id: the vocabulary's last
    ns = parse_megatron_args([*_argv(), "--vocab-size", "256"])  # the natural-looking flag pads to 384 rows
    assert padded_vocab_size(ns, version) == (257, 384)


@pytest.mark.parametrize("version", ["0.18", "0.19"])
def test_null_tokenizer_from_0_18_holds_the_whole_vocabulary(version: str) -> None:
    ns = parse_megatron_args(_argv(megatron_version=version))
    assert (ns.vocab_size, ns.null_tokenizer_eod_id) == (256, 255)
    assert padded_vocab_size(ns, version) == (256, 256)
    assert eod_id(ns, version) == 255
    argv = _argv(megatron_version=version)
    del argv[argv.index("--null-tokenizer-eod-id"):argv.index("--null-tokenizer-eod-id") + 2]
    assert eod_id(parse_megatron_args(argv), version) == 255  # the default, vocab_size - 1
    old = parse_megatron_args(_argv(megatron_version="0.16"))  # 0.16's flags on 0.19: eod 254, as seen on an H200
    assert (padded_vocab_size(old, version), eod_id(old, version)) == ((255, 256), 254)


def test_unknown_flags_are_rejected_by_name() -> None:
    with pytest.raises(ConfigError) as err:
        parse_megatron_args([*_argv(), "--use-flash-attn", "--moe-expert-capacity-factor", "1.0"])
    text = str(err.value)
    assert "--use-flash-attn" in text
    assert "--moe-expert-capacity-factor" in text


@pytest.mark.parametrize(("extra", "message"), [
    (["--dataloader-type", "cyclic"], "--dataloader-type cyclic"),
    (["--split", "969,30,1"], "--split"),
    (["--tokenizer-type", "GPT2BPETokenizer"], "--tokenizer-type"),
    (["--ckpt-format", "torch_dist", "--save", "x"], "--ckpt-format torch_dist with --save"),
    (["--ckpt-format", "torch_dcp", "--load", "x"], "--ckpt-format torch_dcp"),
    (["--expert-model-parallel-size", "2"], "--expert-model-parallel-size 2"),
    (["--fp16"], "--fp16"),
    (["--eval-iters", "10", "--eval-interval", "5"], "--eval-iters 0"),
])
def test_settings_the_twin_does_not_implement_are_rejected(extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_megatron_args([*_argv(), *extra])


def test_megatron_defaults_are_megatron_s() -> None:
    argv = _argv()
    for flag in ("--attention-dropout", "--hidden-dropout"):
        i = argv.index(flag)
        del argv[i : i + 2]
    model = model_config_from_megatron(parse_megatron_args(argv))
    assert model.hidden_dropout == model.attention_dropout == 0.1  # Megatron's default, which the twin refuses
    with pytest.raises(ConfigError, match="dropout"):
        twin_spec(model)


@pytest.mark.parametrize(("freq", "pattern"), [
    ("1", [1, 1, 1, 1]), ("2", [1, 0, 1, 0]), ("[0,1,1,1]", [0, 1, 1, 1]), ("([0]*1+[1]*3)", [0, 1, 1, 1]),
])
def test_moe_layer_freq_forms(freq: str, pattern: list[int]) -> None:
    assert moe_layer_pattern(freq, 4) == pattern


@pytest.mark.parametrize("freq", ["__import__('os').system('true')", "[0,1]", "0", "[0.5]*4"])
def test_moe_layer_freq_is_never_evaluated_as_code(freq: str) -> None:
    with pytest.raises(ConfigError, match="--moe-layer-freq"):
        moe_layer_pattern(freq, 4)


def test_the_twin_trains_on_exactly_the_flags_a_real_megatron_run_gets() -> None:
    from alignflow.backends.megatron import pretrain_flags
    from alignflow.twin.render import twin_env

    for version in ("0.16", "0.19"):
        twin = _argv(megatron_version=version)
        real = pretrain_flags(preset("twin-moe"), training(30), steps=30, data_path="data/d", load=None,
                              transformer_impl="local", megatron_version=version, data_cache_path=None)
        assert twin == real
        assert not any(a.startswith("--twin") for a in twin)
    assert twin_env(data_sha256="ab" * 32, megatron_version="0.17") == {
        "ALIGNFLOW_TWIN_MEGATRON_VERSION": "0.17", "ALIGNFLOW_TWIN_DATA_SHA256": "ab" * 32}
    assert "--moe-grouped-gemm" in _argv(transformer_impl="transformer_engine")


def test_lenient_mode_reads_a_real_megatron_command_line() -> None:
    argv = [*_argv(), "--use-flash-attn", "--recompute-activations", "--cpu-offloading-num-layers", "2",
            "--tensor-model-parallel-size", "8"]
    ns = parse_megatron_args(argv, strict=False)
    assert ns.unknown_args == ["--use-flash-attn", "--recompute-activations", "--cpu-offloading-num-layers", "2"]
    assert ns.tensor_model_parallel_size == 8
    assert model_config_from_megatron(ns).moe is not None
