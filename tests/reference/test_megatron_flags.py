from __future__ import annotations

import pytest

from alignflow.errors import ConfigError
from alignflow.reference.megatron_flags import (
    model_config_from_megatron,
    moe_layer_pattern,
    padded_vocab_size,
    parse_megatron_args,
)
from alignflow.reference.presets import PRESETS, preset, twin_spec
from alignflow.reference.render import megatron_args

from .conftest import training


def _argv(name: str = "twin-moe", **kw: object) -> list[str]:
    return megatron_args(preset(name), training(30), data_path="d.tokens", data_sha256=None, load=None, save=None,
                         steps=30, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_rendered_flags_read_back_as_the_same_model(name: str) -> None:
    ns = parse_megatron_args(_argv(name))
    back = model_config_from_megatron(ns, family=name)
    assert twin_spec(back) == twin_spec(preset(name))


def test_null_tokenizer_adds_one_id_before_padding() -> None:
    ns = parse_megatron_args(_argv())
    assert ns.vocab_size == 255
    assert padded_vocab_size(ns) == (256, 256)
    ns = parse_megatron_args([*_argv(), "--vocab-size", "256"])  # the natural-looking flag pads to 384 rows
    assert padded_vocab_size(ns) == (257, 384)


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
    (["--ckpt-format", "torch_dist", "--load", "x"], "--ckpt-format torch_dist"),
    (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size 2"),
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


def test_twin_extensions_are_rendered_only_for_the_twin() -> None:
    from alignflow.backends.megatron import model_flags, training_flags

    twin = _argv(megatron_version="0.17")
    assert twin[twin.index("--twin-megatron-version") + 1] == "0.17"
    real = [*model_flags(preset("twin-moe")), *training_flags(training(30), steps=30)]
    assert not any(a.startswith("--twin-") for a in real)
    assert twin[2:2 + len(real)] == real  # the twin trains on exactly the flags a real Megatron-LM run gets
    assert "--moe-grouped-gemm" in _argv(transformer_impl="transformer_engine")


def test_lenient_mode_reads_a_real_megatron_command_line() -> None:
    argv = [*_argv(), "--use-flash-attn", "--recompute-granularity", "full", "--tensor-model-parallel-size", "8"]
    ns = parse_megatron_args(argv, strict=False)
    assert ns.unknown_args == ["--use-flash-attn", "--recompute-granularity", "full"]
    assert ns.tensor_model_parallel_size == 8
    assert model_config_from_megatron(ns).moe is not None
