"""Step 3 and its reverse: spec-driven, bit-exact round trips, golden layouts, and loud failures."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from alignflow.config.model import LinearAttentionConfig, ModelConfig, MoEConfig, MTPConfig
from alignflow.convert import build_plan, convert_bf16, convert_to_megatron, convert_to_mindformers, load_spec
from alignflow.convert.megatron import write_megatron
from alignflow.errors import ConfigError, ConversionError

from .synthetic import read_megatron, read_mindformers, same_bits, source_state, write_mindformers

# The Qwen3.5 specs convert real-size layers (seconds each): the slow tier.
ROUND_TRIPS = [(name, flavor) for name in ("twin-dense", "twin-moe", "twin-moe-bias", "gpt-dense")
               for flavor in ("local", "te")] + [("glm52-mini", "te"),  # no local Megatron spec builds MLA + DSA
                                                 pytest.param("qwen35-dense", "te", marks=pytest.mark.slow),
                                                 pytest.param("qwen35-moe", "te", marks=pytest.mark.slow)]


def _model(name: str) -> ModelConfig | None:
    """The spec's documented shapes; for Qwen3.5 with a 1024-token vocabulary instead of 248320 (the two
    embedding matrices would add 1 GB of I/O to the test and cover no mapping that the layers do not)."""
    if name.startswith("qwen35"):
        return load_spec(name).model.model_copy(update={"vocab_size": 1024})
    return None


@pytest.mark.parametrize(("name", "flavor"), ROUND_TRIPS)
def test_round_trip_mindformers_megatron_mindformers_is_bit_exact(tmp_path, name, flavor):
    model = _model(name)
    src = source_state(name, model, flavor=flavor)
    write_mindformers(tmp_path / "bf16", src)
    to_mg = convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec=name, model=model, flavor=flavor)
    back = convert_to_mindformers(tmp_path / "mg", tmp_path / "back", spec=name, model=model, flavor=flavor)
    assert to_mg.tensors == len(build_plan(load_spec(name), model, flavor=flavor).targets)
    assert back.tensors == len(src)
    assert back.dropped == tuple(sorted(back.dropped))
    got = read_mindformers(tmp_path / "back")
    assert set(got) == set(src)
    assert all(same_bits(got[k], src[k]) for k in src)


def _twin_mg(tmp_path, spec="twin-moe-bias", flavor="local", version="0.16"):
    src = source_state(spec, flavor=flavor, seed=3)
    write_mindformers(tmp_path / "bf16", src)
    convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec=spec, flavor=flavor, megatron_version=version)
    return src, read_megatron(tmp_path / "mg")


def test_twin_local_layout_is_the_contract(tmp_path):
    src, payload = _twin_mg(tmp_path)
    assert payload["checkpoint_version"] == 3.0
    assert payload["iteration"] == 1
    assert (tmp_path / "mg/latest_checkpointed_iteration.txt").read_text() == "1"
    mg = payload["model"]
    fc1 = src["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(mg["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([fc1[0::2], fc1[1::2]]))
    for prefix in ("decoder.layers.1.", "decoder.layers.3.", "mtp.layers.0.transformer_layer."):
        w1, w2 = src[prefix + "mlp.experts.weight1"], src[prefix + "mlp.experts.weight2"]
        for e in range(4):
            assert torch.equal(mg[f"{prefix}mlp.experts.local_experts.{e}.linear_fc1.weight"], w1[e].T)
            assert torch.equal(mg[f"{prefix}mlp.experts.local_experts.{e}.linear_fc2.weight"], w2[e].T)
            assert mg[f"{prefix}mlp.experts.local_experts.{e}.linear_fc1.weight"].untyped_storage().nbytes() == \
                64 * 2 * 128 * 2  # each expert saved on its own, not as a view of the whole [E, H, 2F]
        sh = src[prefix + "mlp.shared_experts.linear_fc1.weight"]
        assert torch.equal(mg[prefix + "mlp.shared_experts.linear_fc1.weight"], torch.cat([sh[0::2], sh[1::2]]))
        bias = mg[prefix + "mlp.router.expert_bias"]
        assert bias.dtype == torch.float32
        assert torch.equal(bias, src[prefix + "mlp.expert_bias"])
        assert torch.equal(mg[prefix + "mlp.shared_experts.gate_weight"],
                           src[prefix + "mlp.shared_experts.shared_experts_gate.weight"])
    assert not any(k.endswith("_extra_state") for k in mg)
    assert all(v.dtype == torch.bfloat16 for k, v in mg.items() if not k.endswith("expert_bias"))


def test_twin_te_layout_fuses_norms_groups_experts_and_writes_extra_state(tmp_path):
    src, payload = _twin_mg(tmp_path, spec="twin-moe", flavor="te", version="0.17")
    mg = payload["model"]
    assert torch.equal(mg["decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"],
                       src["decoder.layers.0.input_layernorm.weight"])
    assert torch.equal(mg["decoder.layers.0.mlp.linear_fc1.layer_norm_weight"],
                       src["decoder.layers.0.pre_mlp_layernorm.weight"])
    assert "decoder.layers.0.pre_mlp_layernorm.weight" not in mg  # dense: fused into fc1
    norm = "decoder.layers.2.pre_mlp_layernorm.weight"  # MoE layers keep their own pre-MLP norm
    assert torch.equal(mg[norm], src[norm])
    assert torch.equal(mg["decoder.layers.2.mlp.experts.linear_fc1.weight3"],
                       src["decoder.layers.2.mlp.experts.weight1"][3].T)
    assert torch.equal(mg["mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc2.weight1"],
                       src["mtp.layers.0.transformer_layer.mlp.experts.weight2"][1].T)
    layer = ["self_attention.linear_qkv", "self_attention.linear_proj", "self_attention.core_attention"]
    dense, moe = ["mlp.linear_fc1", "mlp.linear_fc2"], ["mlp.experts.linear_fc1", "mlp.experts.linear_fc2",
                                                      "mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"]
    prefixes = [("decoder.layers.0.", dense)] + [(f"decoder.layers.{i}.", moe) for i in (1, 2, 3)] + \
        [("mtp.layers.0.mtp_model_layer.", moe)]
    expected = {f"{p}{m}._extra_state" for p, ffn in prefixes for m in layer + ffn} | {"output_layer._extra_state"}
    # the TE norms that do not fuse into a linear (TENorm) carry one too: MoE pre-MLP, final and MTP norms
    expected |= {f"{p}pre_mlp_layernorm._extra_state" for p, ffn in prefixes if ffn is moe}
    expected |= {f"{n}._extra_state" for n in ("decoder.final_layernorm", "mtp.layers.0.enorm", "mtp.layers.0.hnorm",
                                                "mtp.layers.0.final_layernorm")}
    assert {k for k in mg if k.endswith("_extra_state")} == expected
    assert all(mg[k] is None for k in expected)


def _small_qwen(moe: bool) -> ModelConfig:
    spec = load_spec("qwen35-moe" if moe else "qwen35-dense")
    return spec.model.model_copy(update={
        "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "num_query_groups": 2,
        "kv_channels": 16, "vocab_size": 128,
        "linear_attention": LinearAttentionConfig(freq=4, key_head_dim=16, value_head_dim=8, num_key_heads=2,
                                                  num_value_heads=4),
        "moe": MoEConfig(num_experts=4, router_topk=2, ffn_hidden_size=32, shared_expert_intermediate_size=32,
                         shared_expert_gate=True) if moe else None,
        "mtp": MTPConfig(num_layers=1)})


def test_qwen35_layouts_follow_seed_001(tmp_path):
    model = _small_qwen(moe=False)
    src = source_state("qwen35-dense", model, flavor="te")
    write_mindformers(tmp_path / "d", src)
    convert_to_megatron(tmp_path / "d", tmp_path / "dmg", spec="qwen35-dense", model=model, flavor="te",
                        megatron_version="0.17")
    mg = read_megatron(tmp_path / "dmg")["model"]
    p = "decoder.layers.0.self_attention."
    parts = [src[p + n + ".weight"] for n in ("in_proj_qkv", "linear_g", "linear_b", "linear_a")]
    assert torch.equal(mg[p + "in_proj.weight"], torch.cat(parts))
    assert torch.equal(mg[p + "conv1d.weight"], src[p + "conv1d.weight"][:, :, 0, :])
    assert torch.equal(mg[p + "A_log"], src[p + "a_log"])
    assert torch.equal(mg[p + "out_proj.weight"], src[p + "linear_proj.weight"])
    assert torch.equal(mg[p + "in_proj.layer_norm_weight"], src["decoder.layers.0.input_layernorm.weight"])
    assert torch.equal(mg["decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"],
                       src["decoder.layers.3.input_layernorm.weight"])
    assert torch.equal(mg["mtp.layers.0.mtp_model_layer.self_attention.linear_qkv.weight"],
                       src["mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight"])
    model = _small_qwen(moe=True)
    src = source_state("qwen35-moe", model, flavor="te")
    write_mindformers(tmp_path / "m", src)
    convert_to_megatron(tmp_path / "m", tmp_path / "mmg", spec="qwen35-moe", model=model, flavor="te")
    mg = read_megatron(tmp_path / "mmg")["model"]
    p = "decoder.layers.1.mlp."
    assert torch.equal(mg[p + "experts.linear_fc1.weight"], src[p + "experts.weight1"].transpose(-1, -2))
    assert torch.equal(mg[p + "experts.linear_fc2.weight"], src[p + "experts.weight2"].transpose(-1, -2))
    sh = src[p + "shared_experts.linear_fc1.weight"]
    assert torch.equal(mg[p + "shared_experts.linear_fc1.weight"], torch.cat([sh[0::2], sh[1::2]]))
    assert torch.equal(mg[p + "shared_experts.gate_weight"], src[p + "shared_experts.shared_experts_gate.weight"])


def test_glm52_mla_dsa_layout(tmp_path):
    flavor = "te"
    src, payload = _twin_mg(tmp_path, spec="glm52-mini", flavor=flavor)
    mg, p = payload["model"], "decoder.layers.1.self_attention."
    qkv = src[p + "linear_qkv.weight"]
    assert torch.equal(mg[p + "linear_q_down_proj.weight"], qkv[:64])
    assert torch.equal(mg[p + "linear_kv_down_proj.weight"], qkv[64:])
    # DSA's AbsorbedMLASelfAttention keeps its own q/kv TENorms (not fused into the up projections as plain MLA's)
    assert torch.equal(mg[p + "q_layernorm.weight"], src[p + "q_layernorm.weight"])
    assert torch.equal(mg[p + "kv_layernorm.weight"], src[p + "k_layernorm.weight"])
    assert not any("up_proj.layer_norm_weight" in k for k in mg)
    assert mg[p + "kv_layernorm._extra_state"] is None
    assert mg[p + "core_attention.indexer.k_norm._extra_state"] is None
    assert torch.equal(mg[p + "core_attention.indexer.k_norm.bias"], src[p + "core_attention.indexer.k_norm.beta"])
    assert mg["decoder.layers.1.mlp.router.expert_bias"].dtype == torch.float32
    assert torch.equal(mg["decoder.layers.2.mlp.experts.linear_fc1.weight7"],
                       src["decoder.layers.2.mlp.experts.weight1"][7].T)


@pytest.mark.parametrize(("spec", "version", "where"), [
    ("glm52-mini", "0.16", "experimental_attention_variant_module_specs.py:356"),
    ("glm52-1b", "0.19", "experimental_attention_variant_module_specs.py:442"),
    ("qwen35-dense", "0.19", "experimental_attention_variant_module_specs.py:442"),
])
def test_a_local_flavour_no_megatron_spec_builds_is_refused_before_anything_is_written(tmp_path, spec, version,
                                                                                        where):
    """MLA, DSA and GatedDeltaNet have no local (non-TE) layer spec in any checked megatron-core
    (alignflow/frameworks/megatron_refusals.py): a local-named checkpoint of them would load into nothing."""
    write_mindformers(tmp_path / "bf16", {"embedding.word_embeddings.weight": torch.zeros(2, 2)})
    with pytest.raises(ConfigError) as err:
        convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec=spec, flavor="local", megatron_version=version)
    message = str(err.value)
    assert f"no local (non-Transformer-Engine) layer spec of megatron-core {version} builds this model" in message
    assert where in str(err.value)
    assert "--flavor te" in str(err.value)
    assert not (tmp_path / "mg").exists()
    if spec.startswith("glm52"):  # MLA is refused on its own too: the local DotProductAttention has no k_channels
        assert "k_channels" in str(err.value)


# --- failure classes: every offending key listed, nothing written ------------------------------------------------

def _fails(tmp_path, tensors, spec="twin-moe", model=None) -> list[str]:
    write_mindformers(tmp_path / "bf16", tensors)
    (tmp_path / "out").mkdir()
    with pytest.raises(ConversionError) as err:
        convert_to_megatron(tmp_path / "bf16", tmp_path / "out" / "mg", spec=spec, model=model)
    assert list((tmp_path / "out").iterdir()) == []
    return err.value.problems


def _keys(problems: list[str]) -> set[str]:
    return {p.split("'")[1] for p in problems}


def test_missing_keys_are_all_listed(tmp_path):
    src = source_state("twin-moe")
    gone = {"decoder.layers.2.mlp.experts.weight2", "mtp.layers.0.eh_proj.weight", "output_layer.weight"}
    problems = _fails(tmp_path, {k: v for k, v in src.items() if k not in gone})
    assert all(p.startswith("missing MindFormers key") for p in problems)
    assert _keys(problems) == gone
    assert len(problems) == 3


def test_extra_keys_are_all_listed(tmp_path):
    extra = {"decoder.layers.0.mlp.linear_fc3.weight": torch.zeros(2), "mtp.layers.0.mystery": torch.zeros(1)}
    problems = _fails(tmp_path, source_state("twin-moe") | extra)
    assert all(p.startswith("unused MindFormers key") for p in problems)
    assert _keys(problems) == set(extra)


def test_wrong_shapes_are_all_listed(tmp_path):
    src = source_state("twin-moe")
    src["decoder.layers.1.self_attention.linear_proj.weight"] = torch.zeros(128, 96, dtype=torch.bfloat16)
    src["decoder.layers.0.mlp.linear_fc1.weight"] = torch.zeros(256, 128, dtype=torch.bfloat16)
    problems = _fails(tmp_path, src)
    assert _keys(problems) == {"decoder.layers.1.self_attention.linear_proj.weight",
                               "decoder.layers.0.mlp.linear_fc1.weight"}
    assert any("has [128, 96], the spec expects [128, 128]" in p for p in problems)


def test_wrong_expert_count_lists_every_expert_tensor(tmp_path):
    spec = load_spec("twin-moe")
    eight = spec.model.model_copy(update={"moe": spec.model.moe.model_copy(update={"num_experts": 8})})
    problems = _fails(tmp_path, source_state("twin-moe", eight))
    prefixes = ["decoder.layers.1.", "decoder.layers.2.", "decoder.layers.3.", "mtp.layers.0.transformer_layer."]
    assert _keys(problems) == {p + s for p in prefixes for s in
                               ("mlp.router.weight", "mlp.experts.weight1", "mlp.experts.weight2")}
    assert all(p.startswith("wrong shape") for p in problems)


def test_spec_for_another_model_lists_every_key(tmp_path):
    problems = _fails(tmp_path, source_state("twin-dense"), spec="twin-moe")
    layers = ["decoder.layers.1.", "decoder.layers.2.", "decoder.layers.3.", "mtp.layers.0.transformer_layer."]
    missing = {p + s for p in layers for s in ("mlp.router.weight", "mlp.experts.weight1", "mlp.experts.weight2",
                                               "mlp.shared_experts.linear_fc1.weight",
                                               "mlp.shared_experts.linear_fc2.weight",
                                               "mlp.shared_experts.shared_experts_gate.weight")}
    unused = {p + s for p in layers for s in ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight")}
    assert _keys([p for p in problems if p.startswith("missing")]) == missing
    assert _keys([p for p in problems if p.startswith("unused")]) == unused
    assert len(problems) == len(missing) + len(unused)


def test_hidden_size_of_another_model_lists_every_key(tmp_path):
    src = source_state("twin-moe")
    wide = load_spec("twin-moe").model.model_copy(update={"hidden_size": 256})
    problems = _fails(tmp_path, src, model=wide)
    assert _keys(problems) == set(src)  # every tensor of the twin has a hidden-size dimension
    assert len(problems) == len(src)
    assert all(p.startswith("wrong shape") for p in problems)


def test_expert_bias_must_stay_fp32(tmp_path):
    src = source_state("twin-moe-bias")
    src["decoder.layers.2.mlp.expert_bias"] = src["decoder.layers.2.mlp.expert_bias"].to(torch.bfloat16)
    problems = _fails(tmp_path, src, spec="twin-moe-bias")
    assert problems == ["wrong dtype 'decoder.layers.2.mlp.expert_bias': bfloat16, the spec requires float32 "
                        f"(rule twin-moe.yaml:{problems[0].rsplit(':', 1)[1]}"]


def test_mixed_dtypes_in_a_concat_are_refused(tmp_path):
    model = _small_qwen(moe=False)
    src = source_state("qwen35-dense", model, flavor="te")
    key = "decoder.layers.1.self_attention.linear_b.weight"
    src[key] = src[key].float()
    write_mindformers(tmp_path / "bf16", src)
    with pytest.raises(ConversionError, match=r"mixed dtypes \['bfloat16', 'float32'\]"):
        convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec="qwen35-dense", model=model, flavor="te")


def test_optimizer_and_counters_in_the_source_are_dropped_and_listed(tmp_path):
    src = source_state("twin-moe") | {"decoder.layers.1.mlp.tokens_per_expert": torch.zeros(4)}
    write_mindformers(tmp_path / "base", src, optimizer={"adam_m.output_layer.weight": torch.zeros(1)})
    summary = convert_to_megatron(tmp_path / "base", tmp_path / "mg", spec="twin-moe")
    assert summary.dropped == ("adam_m.output_layer.weight", "decoder.layers.1.mlp.tokens_per_expert")


def test_destination_is_never_overwritten(tmp_path):
    write_mindformers(tmp_path / "bf16", source_state("twin-dense"))
    (tmp_path / "mg").mkdir()
    (tmp_path / "mg" / "keep.txt").write_text("mine")
    with pytest.raises(ConversionError, match="already exists"):
        convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec="twin-dense")
    assert (tmp_path / "mg" / "keep.txt").read_text() == "mine"


def test_bf16_then_megatron_from_an_fp32_base_checkpoint(tmp_path):
    src = source_state("twin-moe-bias", dtype=torch.float32)
    write_mindformers(tmp_path / "base", src | {"decoder.layers.1.mlp.tokens_per_expert": torch.zeros(4)},
                      optimizer={k.replace("decoder", "adam_m.decoder"): v for k, v in list(src.items())[:3]})
    calls: list[tuple[int, int]] = []
    convert_bf16(tmp_path / "base", tmp_path / "bf16", progress=lambda d, t: calls.append((d, t)))
    summary = convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec="twin-moe-bias", iteration=7,
                                  progress=lambda d, t: calls.append((d, t)))
    assert summary.iteration == 7
    assert summary.dropped == ()
    assert dict(summary.dtypes) == {"bfloat16": 77, "float32": 4}
    mg = read_megatron(tmp_path / "mg")
    assert mg["iteration"] == 7
    assert same_bits(mg["model"]["output_layer.weight"], src["output_layer.weight"].to(torch.bfloat16))
    assert calls[-1][0] == calls[-1][1]
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(calls)
                                                if a[1] == b[1])


# --- skeleton: a Megatron-saved checkpoint of the target model as the contract -------------------------------------

def _skeleton(tmp_path, plan_spec="twin-moe", drop=(), add=(), dtype=torch.float32):
    plan = build_plan(load_spec(plan_spec), flavor="te")
    state = {k: torch.zeros(s, dtype=dtype) for k, s in plan.target_shapes().items() if k not in drop}
    state |= {k: torch.zeros(2) for k in add}
    state |= {"output_layer._extra_state": None, "decoder.layers.0.self_attention.linear_qkv._extra_state":
              torch.tensor([1, 2, 3], dtype=torch.uint8)}
    (tmp_path / "skel").mkdir()
    write_megatron(tmp_path / "skel", state, 1)
    return tmp_path / "skel"


def test_skeleton_sets_dtypes_and_extra_state(tmp_path):
    skel = _skeleton(tmp_path)
    write_mindformers(tmp_path / "bf16", source_state("twin-moe", flavor="te"))
    summary = convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec="twin-moe", flavor="te", skeleton=skel)
    mg = read_megatron(tmp_path / "mg")["model"]
    assert {k for k in mg if k.endswith("_extra_state")} == {"output_layer._extra_state",
                                                             "decoder.layers.0.self_attention.linear_qkv._extra_state"}
    assert torch.equal(mg["decoder.layers.0.self_attention.linear_qkv._extra_state"], torch.tensor([1, 2, 3],
                                                                                                   dtype=torch.uint8))
    assert all(v.dtype == torch.float32 for k, v in mg.items() if v is not None and not k.endswith("_extra_state"))
    assert summary.extra_state_keys == 2
    assert summary.notes


def test_skeleton_differences_are_all_listed(tmp_path):
    skel = _skeleton(tmp_path, drop=("decoder.layers.1.mlp.router.weight",), add=("decoder.layers.1.mlp.router.bias",))
    write_mindformers(tmp_path / "bf16", source_state("twin-moe", flavor="te"))
    with pytest.raises(ConversionError) as err:
        convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec="twin-moe", flavor="te", skeleton=skel)
    assert _keys(err.value.problems) == {"decoder.layers.1.mlp.router.weight", "decoder.layers.1.mlp.router.bias"}


# --- reverse conversion and the Megatron reader ---------------------------------------------------------------------

def test_reverse_conversion_lists_missing_unused_and_foreign_entries(tmp_path):
    _, payload = _twin_mg(tmp_path, spec="twin-moe")
    model = payload["model"]
    del model["decoder.layers.3.mlp.router.weight"]
    model["decoder.layers.3.mlp.router.bias"] = torch.zeros(4)
    model["decoder.layers.0.self_attention.linear_qkv._extra_state"] = None  # Megatron's own: dropped, listed
    (tmp_path / "edited").mkdir()
    write_megatron(tmp_path / "edited", model, 5)
    with pytest.raises(ConversionError) as err:
        convert_to_mindformers(tmp_path / "edited", tmp_path / "back", spec="twin-moe")
    assert _keys(err.value.problems) == {"decoder.layers.3.mlp.router.weight", "decoder.layers.3.mlp.router.bias"}
    assert not (tmp_path / "back").exists()


@pytest.mark.integration  # the tp 2 layout is planned by megatron-core in a process of its own (unless cached)
def test_megatron_reader_refuses_a_rank_directory_without_its_file(tmp_path):
    _twin_mg(tmp_path, spec="twin-dense")
    (tmp_path / "mg/iter_0000001/mp_rank_01").mkdir()  # read as tp 2: the TP = 1 file is no tp 2 rank's
    with pytest.raises(ConversionError, match=r"mp_rank_01/model_optim_rng.pt: missing \(rank tp 1 pp 0 ep 0 of tp 2"):
        convert_to_mindformers(tmp_path / "mg", tmp_path / "back", spec="twin-dense")


def test_megatron_reader_refuses_what_it_cannot_read(tmp_path):
    _twin_mg(tmp_path, spec="twin-dense")
    (tmp_path / "mg/latest_checkpointed_iteration.txt").write_text("last")
    with pytest.raises(ConversionError, match="expected an iteration number or 'release'"):
        convert_to_mindformers(tmp_path / "mg", tmp_path / "back", spec="twin-dense")
    bad = tmp_path / "np" / "release" / "mp_rank_00"
    bad.mkdir(parents=True)
    torch.save({"model": {}, "iteration": np.float64(1.0)}, bad / "model_optim_rng.pt")
    (tmp_path / "np/latest_checkpointed_iteration.txt").write_text("release")
    with pytest.raises(ConversionError, match="weights_only"):
        convert_to_mindformers(tmp_path / "np", tmp_path / "back", spec="twin-dense")


def test_release_checkpoint_and_iteration_override(tmp_path):
    src, _payload = _twin_mg(tmp_path, spec="twin-dense")
    (tmp_path / "rel/release/mp_rank_00").mkdir(parents=True)
    (tmp_path / "mg/iter_0000001/mp_rank_00/model_optim_rng.pt").rename(tmp_path / "rel/release/mp_rank_00/"
                                                                          "model_optim_rng.pt")
    (tmp_path / "rel/latest_checkpointed_iteration.txt").write_text("release")
    summary = convert_to_mindformers(tmp_path / "rel", tmp_path / "back", spec="twin-dense", iteration=42,
                                     prefix="twin")
    assert summary.iteration == 42
    assert (tmp_path / "back/iteration_00000042/twin-model-0000000-0000001.safetensors").is_file()
    got = read_mindformers(tmp_path / "back")
    assert all(same_bits(got[k], src[k]) for k in src)
    assert math.isclose(summary.bytes, sum(v.numel() * v.element_size() for v in src.values()))
