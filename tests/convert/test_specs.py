"""The packaged specs: they load, expand to the seeds' key counts and shapes, and spec mistakes fail at load
time with their file and line."""

from __future__ import annotations

import pytest

from alignflow.config.model import ModelConfig
from alignflow.convert import build_plan, list_specs, load_spec
from alignflow.convert.plan import mtp_inner_layer, parse_version
from alignflow.errors import ConfigError

ALL = ["twin-dense", "twin-moe", "twin-moe-bias", "qwen35-dense", "qwen35-moe", "glm52-mini", "glm52-1b", "gpt-dense"]


def test_every_required_spec_is_packaged_and_self_consistent():
    infos = {i.name: i for i in list_specs()}
    assert set(ALL) <= set(infos)
    for name in ALL:
        spec = load_spec(name)
        for flavor in spec.flavors:
            assert not build_plan(spec, flavor=flavor).problems


@pytest.mark.parametrize(("name", "total", "decoder", "mtp"),
                         [("qwen35-dense", 91, 76, 12), ("qwen35-moe", 127, 108, 16)])
def test_qwen35_key_counts_are_the_seeds(name, total, decoder, mtp):
    targets = build_plan(load_spec(name), flavor="te").targets
    assert len(targets) == len(set(targets)) == total  # docs/seeds.md#mtp-mapping-rules
    assert sum(t.startswith("decoder.layers.") for t in targets) == decoder
    assert sum(t.startswith("mtp.") for t in targets) == mtp
    assert {t for t in targets if not t.startswith(("decoder.layers.", "mtp."))} == {
        "embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight"}


def test_qwen35_shapes_are_the_seeds():
    dense = build_plan(load_spec("qwen35-dense"), flavor="te")
    src, dst = dense.source_shapes(), dense.target_shapes()
    assert src["decoder.layers.3.self_attention.linear_qkv.weight"] == (10240, 1024)  # full attention, layer 3
    assert dst["decoder.layers.0.self_attention.in_proj.weight"] == (8224, 1024)
    assert src["decoder.layers.0.self_attention.conv1d.weight"] == (6144, 1, 1, 4)
    assert dst["decoder.layers.0.self_attention.conv1d.weight"] == (6144, 1, 4)
    assert dst["decoder.layers.0.self_attention.out_norm.weight"] == (128,)
    assert "decoder.layers.0.self_attention.A_log" in dst
    assert "decoder.layers.0.self_attention.a_log" in src
    assert "decoder.layers.7.self_attention.linear_qkv.layer_norm_weight" in dst
    assert "decoder.layers.6.self_attention.in_proj.layer_norm_weight" in dst
    moe = build_plan(load_spec("qwen35-moe"), flavor="te")
    src, dst = moe.source_shapes(), moe.target_shapes()
    assert src["decoder.layers.0.mlp.experts.weight1"] == (8, 1024, 1024)
    assert dst["decoder.layers.0.mlp.experts.linear_fc1.weight"] == (8, 1024, 1024)
    assert src["decoder.layers.0.mlp.experts.weight2"] == (8, 512, 1024)
    assert dst["decoder.layers.0.mlp.experts.linear_fc2.weight"] == (8, 1024, 512)
    assert src["decoder.layers.0.mlp.shared_experts.shared_experts_gate.weight"] == (1, 1024)
    assert dst["decoder.layers.0.mlp.shared_experts.gate_weight"] == (1, 1024)
    assert "mtp.layers.0.transformer_layer.mlp.router.weight" in dst  # megatron-core 0.16 name


def test_mtp_inner_layer_name_follows_the_megatron_version():
    assert mtp_inner_layer("0.16") == mtp_inner_layer("0.16.1") == "transformer_layer"
    assert mtp_inner_layer("0.17") == mtp_inner_layer("0.19.2") == mtp_inner_layer("1.0.0rc1") == "mtp_model_layer"
    targets = build_plan(load_spec("twin-moe"), megatron_version="0.19").targets
    assert "mtp.layers.0.mtp_model_layer.mlp.router.weight" in targets
    assert not any(".transformer_layer." in t for t in targets)
    with pytest.raises(ValueError, match=r"not X\.Y"):
        parse_version("latest")


@pytest.mark.integration
def test_one_megatron_version_parser_for_converter_twin_and_preflight():
    import subprocess
    import sys

    from alignflow.frameworks.megatron_lm import check_flags, load_table
    from alignflow.twin import flavours

    assert flavours.parse_version is parse_version
    for text, expected in [("0.16", (0, 16)), ("0.16.1", (0, 16)), ("0.17.0rc1", (0, 17)), ("v0.19", (0, 19)),
                           ("core_v0.17.0", (0, 17)), ("core_r0.19.0", (0, 19)), (" 1.0.0rc1 ", (1, 0))]:
        assert parse_version(text) == expected
        assert flavours.mtp_inner_name(text) == mtp_inner_layer(text)
    assert load_table("v0.16") == load_table("0.16.1") == load_table("0.16")
    for bad in ["latest", "", "16", "0.x", "main-0.16"]:
        for call in (parse_version, flavours.parse_version, flavours.timestamp_has_microseconds, load_table):
            with pytest.raises(ConfigError, match=r"not X\.Y"):  # and a ValueError, as the CLI expects
                call(bad)
        with pytest.raises(ValueError, match=r"not X\.Y"):
            parse_version(bad)
    accepted, why = check_flags(["--lr", "1e-3"], "latest")
    assert accepted is False
    assert "not X.Y" in why
    # the parser is torch-free: the MindSpore twin and preflight import it without torch
    code = ("import sys, alignflow.convert.layout, alignflow.twin.flavours, alignflow.frameworks.megatron_lm; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_glm52_1b_is_about_one_billion_parameters():
    shapes = build_plan(load_spec("glm52-1b"), flavor="te").target_shapes()
    params = sum(int(__import__("math").prod(s)) for s in shapes.values())
    assert 0.95e9 < params < 1.1e9  # docs/seeds.md#glm-52-1b "1B level", ~2 GB in bf16


def test_model_outside_what_a_spec_covers_is_a_problem():
    spec = load_spec("twin-moe")
    model = spec.model.model_copy(update={"qk_layernorm": True, "vocab_size": 250})
    problems = build_plan(spec, model).problems
    assert any(p.startswith("model.qk_layernorm = True: spec twin-moe covers only [False]") for p in problems)
    assert any("pads to 256" in p for p in problems)
    with pytest.raises(ValueError, match="no 'local' flavour"):
        build_plan(load_spec("qwen35-moe"), model.model_copy(update={"qk_layernorm": False}), flavor="local")
    with pytest.raises(ValueError, match=r"no local \(non-Transformer-Engine\) layer spec of megatron-core 0.16"):
        build_plan(load_spec("qwen35-moe"), flavor="local")  # GatedDeltaNet: TE only


def test_model_without_the_sections_a_spec_needs_lists_them():
    glm = load_spec("glm52-mini")
    dense = ModelConfig(family="x", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                        vocab_size=128, seq_length=8)
    problems = build_plan(glm, dense, flavor="te").problems
    assert "model.mla is not set, but spec glm52-mini needs it" in problems
    assert any("needs 'q_lora'" in p for p in problems)


def _spec_file(tmp_path, rule: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text("extends: twin-moe\nname: mine\nglobal_rules:\n" + rule)
    return str(path)


@pytest.mark.parametrize(("rule", "message"), [
    ("  - {target: a, source: a, shape: [hidden], ops: [flip]}\n", "unknown op 'flip'"),
    ("  - {target: a, source: a, shape: [hidden], ops: [squeeze]}\n", "needs parameter(s) ['dim']"),
    ("  - {target: a, source: a, shape: [hidden], ops: [transpose: {axis: 1}]}\n", "has no parameter(s) ['axis']"),
    ("  - {target: a, source: a, shape: [hiden]}\n", "unknown dimension 'hiden'"),
    ("  - {target: a, source: a, shape: [hidden], when: [moe]}\n", "unknown predicate(s) ['moe']"),
    ("  - {target: 'a.{layer}', source: a, shape: [hidden]}\n", "unknown capture(s) ['layer']"),
    ("  - {target: a, source: a, shape: [hidden], colour: red}\n", "unknown key"),
    ("  - {target: a, source: a, shape: ['hidden ** 2']}\n", "only + - * //"),
])
def test_spec_mistakes_fail_at_load_with_file_and_line(tmp_path, rule, message):
    with pytest.raises(ConfigError) as err:
        load_spec(_spec_file(tmp_path, rule))
    assert message in str(err.value)
    assert any(p[0].endswith("mine.yaml") and p[1] == 4 for p in err.value.problems), err.value.problems


def test_rules_that_do_not_fit_their_own_model_never_load(tmp_path):
    bad = "  - {target: a, source: a, shape: [hidden], ops: [deinterleave_rows: {dim: 0}, squeeze: {dim: 0}]}\n"
    with pytest.raises(ConfigError, match=r"rule mine.yaml:4 at model level: cannot \(de\)interleave an odd dim"):
        load_spec(_spec_file(tmp_path, bad))
    dup = ("  - {target: embedding.word_embeddings.weight, source: embedding.word_embeddings.weight,"
           " shape: [vocab, hidden]}\n"
           "  - {target: embedding.word_embeddings.weight, source: other, shape: [vocab, hidden]}\n")
    with pytest.raises(ConfigError, match="produced twice"):
        load_spec(_spec_file(tmp_path, dup))


def test_unknown_spec_lists_the_known_ones():
    with pytest.raises(ConfigError, match="known: glm52-1b, glm52-mini, gpt-dense"):
        load_spec("llama-9000")
