"""Converted checkpoints load into real megatron-core 0.16.1 GPTModels (CPU, local spec, strict=True), and a
wrong mapping that still loads is caught only by comparing values, which is why the step-1 parity gate exists.

Built with `benchmarks/megatron_load_check.py`, the script the GPU run uses unchanged. On CPU-only torch it
builds MoE layers with the `allgather` dispatcher and redirects `torch.cuda.current_device` to the CPU while
the model is constructed (the router's expert-bias buffers); nothing else is faked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from alignflow.convert import build_plan, convert_bf16, convert_to_megatron, convert_to_mindformers, load_spec
from alignflow.convert.mcore import build_gpt_model
from alignflow.convert.megatron import write_megatron
from alignflow.errors import ConversionError
from benchmarks.megatron_load_check import load_into, model_parallel

from .synthetic import read_megatron, read_mindformers, same_bits, source_state, write_mindformers

TWINS = ["twin-dense", "twin-moe", "twin-moe-bias"]
# megatron-core's import chain reaches torch.utils.mkldnn, which warns about torch.jit.script_method (torch's own
# deprecation, not ours); everything else stays an error.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def megatron_world():
    with model_parallel("cpu"):
        yield


def _converted(tmp_path, name, spec=None):
    """fp32 base checkpoint (with an optimizer file and counters) -> bf16 -> Megatron local."""
    src = source_state(name, dtype=torch.float32)
    counters = {k.replace("expert_bias", "tokens_per_expert"): torch.zeros(4) for k in src if "expert_bias" in k}
    write_mindformers(tmp_path / "base", src | counters, optimizer={"adam_m.output_layer.weight": torch.zeros(1)})
    convert_bf16(tmp_path / "base", tmp_path / "bf16")
    convert_to_megatron(tmp_path / "bf16", tmp_path / "mg", spec=spec or name, flavor="local")
    return read_mindformers(tmp_path / "bf16")


@pytest.mark.parametrize("name", TWINS)
def test_converted_twin_loads_strictly_and_reads_back_bit_exact(tmp_path, megatron_world, name):
    bf16 = _converted(tmp_path, name)
    model = load_spec(name).model
    gpt = build_gpt_model(model)
    report = load_into(gpt, tmp_path / "mg")
    assert report["strict_load"] == "<All keys matched successfully>"
    assert report["ok"]
    assert report["differing"] == []
    own = gpt.state_dict()
    weights = {k for k, v in own.items() if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")}
    assert weights == set(build_plan(load_spec(name)).targets)
    assert (("decoder.layers.1.mlp.router.expert_bias" in weights) == (name == "twin-moe-bias"))
    # Megatron's own state dict (with its `_extra_state: None` entries) converts back to the same bf16 weights
    dtypes = {k: v.dtype for k, v in read_megatron(tmp_path / "mg")["model"].items()}
    own_ckpt = {k: (v.detach().to(dtypes[k]) if k in dtypes else v) for k, v in own.items()}
    assert sum(k.endswith("_extra_state") for k in own_ckpt) > 0
    (tmp_path / "own").mkdir()
    write_megatron(tmp_path / "own", own_ckpt, 1)
    back = convert_to_mindformers(tmp_path / "own", tmp_path / "back", spec=name)
    assert back.dropped
    assert all(k.endswith("_extra_state") for k in back.dropped)
    got = read_mindformers(tmp_path / "back")
    assert set(got) == set(bf16)
    assert all(same_bits(got[k], bf16[k]) for k in bf16)


def test_wrong_mapping_loads_but_the_weights_and_outputs_differ(tmp_path, megatron_world):
    spec = load_spec("twin-moe")
    no_deinterleave = [r.model_copy(update={"ops": []}) if r.target == "mlp.linear_fc1.weight" else r
                       for r in spec.layer_rules]
    wrong = spec.model_copy(update={"name": "twin-moe-wrong-fc1", "layer_rules": no_deinterleave})
    bf16 = _converted(tmp_path, "twin-moe")
    convert_to_megatron(tmp_path / "bf16", tmp_path / "mg-wrong", spec=wrong, flavor="local")
    right_model, wrong_model = build_gpt_model(spec.model), build_gpt_model(spec.model)
    assert load_into(right_model, tmp_path / "mg")["ok"]
    assert load_into(wrong_model, tmp_path / "mg-wrong")["ok"]  # Megatron cannot tell: same names, same shapes
    right, bad = right_model.state_dict(), wrong_model.state_dict()
    differing = {k for k, v in right.items() if isinstance(v, torch.Tensor) and not torch.equal(v, bad[k])}
    assert differing == {"decoder.layers.0.mlp.linear_fc1.weight"}
    assert torch.equal(bad["decoder.layers.0.mlp.linear_fc1.weight"], bf16["decoder.layers.0.mlp.linear_fc1.weight"])
    x = torch.randn(8, 2, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        y_right = right_model.decoder.layers[0].mlp(x)[0]
        y_bad = wrong_model.decoder.layers[0].mlp(x)[0]
    assert (y_right.float() - y_bad.float()).abs().max() > 0.1 * y_right.float().abs().max()


def test_megatron_saved_skeleton_is_the_contract(tmp_path, megatron_world):
    _converted(tmp_path, "twin-moe")
    skeleton = build_gpt_model(load_spec("twin-moe").model).state_dict()
    (tmp_path / "skel").mkdir()
    write_megatron(tmp_path / "skel", skeleton, 0)
    summary = convert_to_megatron(tmp_path / "bf16", tmp_path / "mg-skel", spec="twin-moe", skeleton=tmp_path / "skel")
    assert summary.extra_state_keys == sum(k.endswith("_extra_state") for k in skeleton)
    assert load_into(build_gpt_model(load_spec("twin-moe").model), tmp_path / "mg-skel")["ok"]
    _converted(tmp_path / "bias", "twin-moe-bias")
    with pytest.raises(ConversionError) as err:  # the bias twin's checkpoint against the plain twin's model
        convert_to_megatron(tmp_path / "bias/bf16", tmp_path / "mg-bias", spec="twin-moe-bias",
                            skeleton=tmp_path / "skel")
    assert {p.split("'")[1] for p in err.value.problems} == {
        f"{p}mlp.router.expert_bias" for p in ("decoder.layers.1.", "decoder.layers.2.", "decoder.layers.3.",
                                              "mtp.layers.0.transformer_layer.")}


@pytest.mark.integration
def test_load_check_script_passes_good_and_fails_broken_checkpoints(tmp_path, subprocess_env, repo_root):
    _converted(tmp_path, "twin-moe-bias")
    script = [sys.executable, str(repo_root / "benchmarks/megatron_load_check.py")]
    ok = subprocess.run([*script, str(tmp_path / "mg"), "--spec", "twin-moe-bias", "--json"], env=subprocess_env,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    report = json.loads(ok.stdout)
    assert report["ok"]
    assert report["megatron_core"].startswith("0.16")
    assert report["mtp_inner_layer"] == \
        "transformer_layer"
    state = read_megatron(tmp_path / "mg")["model"]
    del state["decoder.layers.2.mlp.router.expert_bias"]  # what Megatron's non-strict fallback would hide
    (tmp_path / "broken").mkdir()
    write_megatron(tmp_path / "broken", state, 1)
    bad = subprocess.run([*script, str(tmp_path / "broken"), "--spec", "twin-moe-bias", "--json"],
                         env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert "decoder.layers.2.mlp.router.expert_bias" in json.loads(bad.stdout)["error"]


@pytest.mark.slow  # transformers' import (~6 s, and numpy.testing's lscpu probe): the slow tier's
def test_a_hugging_face_qwen3_converted_to_megatron_gives_transformers_logits(tmp_path, megatron_world):
    """transformers' own Qwen3ForCausalLM (random weights, GQA-free q/k norm) and the megatron-core GPTModel that
    loads its conversion strictly compute the same logits (fp32): the qwen3-hf spec's grouped qkv, [gate; up] and
    q/k norm mapping and both sides' RoPE convention agree. The one CUDA-only piece, the model-parallel RNG tracker
    that dot-product attention forks for dropout (0 here), is bypassed on this CPU."""
    import contextlib
    import dataclasses
    from unittest import mock

    import transformers
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    from alignflow.convert.formats import convert_checkpoint
    from alignflow.convert.hf import make_hf_checkpoint
    from alignflow.convert.mcore import transformer_config

    model = load_spec("qwen3").model.model_copy(update={"num_query_groups": 2})  # GQA: grouped qkv really groups
    make_hf_checkpoint(model, tmp_path / "hf", seed=5)
    convert_checkpoint(tmp_path / "hf", tmp_path / "mg", source="hf", target="megatron", spec="qwen3", model=model)
    with mock.patch("torch.cuda.current_device", return_value="cpu"):
        cfg = dataclasses.replace(transformer_config(model, device="cpu"), bf16=False, params_dtype=torch.float32,
                                  pipeline_dtype=torch.float32)
        layers = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=model.normalization)
        gpt = GPTModel(config=cfg, transformer_layer_spec=layers, vocab_size=model.padded_vocab_size,
                       max_sequence_length=model.seq_length, share_embeddings_and_output_weights=False,
                       position_embedding_type="rope", rotary_base=int(model.rotary_base))
        assert load_into(gpt, tmp_path / "mg")["strict_load"] == "<All keys matched successfully>"
        hf = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
        tokens = torch.randint(0, model.vocab_size, (2, model.seq_length), generator=torch.Generator().manual_seed(0))
        positions = torch.arange(model.seq_length).expand(2, -1)
        causal = torch.ones(2, 1, model.seq_length, model.seq_length, dtype=torch.bool).triu(1)
        gpt.eval()
        hf.eval()
        with torch.no_grad(), mock.patch.object(tensor_parallel.get_cuda_rng_tracker(), "fork",
                                                contextlib.nullcontext):
            ours = gpt(tokens, positions, causal)
            theirs = hf(tokens).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < 1e-5 * theirs.abs().max().item() + 1e-6
