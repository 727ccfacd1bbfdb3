"""Hugging Face and DCP checkpoints against transformers' own classes: the `<family>-hf` specs name exactly the
tensors `save_pretrained` writes, a Hugging Face Qwen3 reaches MindFormers' names with every tensor equal to the
Hugging Face ones by name mapping (checked here with plain torch, not with the spec's ops), and every conversion
round-trips bit-exactly, through PyTorch DCP too. (That the Megatron side computes what transformers computes is
`test_megatron_real.py::test_a_hugging_face_qwen3_converted_to_megatron_gives_transformers_logits`.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from alignflow.config.model import ModelConfig
from alignflow.convert import build_plan, load_spec
from alignflow.convert.formats import convert_checkpoint, open_checkpoint
from alignflow.convert.hf import hf_architecture, make_hf_checkpoint
from alignflow.errors import ConfigError, ConversionError

# transformers' import (~6 s, and numpy.testing's lscpu probe) is the slow tier's: `make test` runs these
pytestmark = pytest.mark.slow

QWEN3 = load_spec("qwen3").model
LLAMA_GQA = load_spec("gpt-dense").model.model_copy(update={"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 96,
                                                           "num_attention_heads": 4, "num_query_groups": 2,
                                                           "vocab_size": 128, "seq_length": 16})


def _read(fmt: str, path: Path) -> dict[str, torch.Tensor]:
    with open_checkpoint(fmt, path) as ckpt:  # type: ignore[arg-type]
        return {k: ckpt.read(k) for k in ckpt.tensors}


@pytest.mark.parametrize(("spec", "model", "architecture"), [
    ("qwen3-hf", QWEN3, "Qwen3ForCausalLM"),
    ("gpt-dense-hf", LLAMA_GQA, "LlamaForCausalLM"),
    ("gpt-dense-hf", LLAMA_GQA.model_copy(update={"untie_embeddings_and_output_weights": False}), "LlamaForCausalLM"),
])
def test_the_hf_spec_names_exactly_what_transformers_saves(tmp_path: Path, spec: str, model: ModelConfig,
                                                           architecture: str) -> None:
    assert hf_architecture(model)[1] == architecture
    make_hf_checkpoint(model, tmp_path / "hf", seed=1)
    saved = _read("hf", tmp_path / "hf")
    plan = build_plan(load_spec(spec), model)
    assert plan.problems == ()
    assert set(saved) == set(plan.sources)
    assert {k: tuple(v.shape) for k, v in saved.items()} == plan.source_shapes()
    assert ("lm_head.weight" in saved) == model.untie_embeddings_and_output_weights


def _interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """MindFormers PyNative's SwiGLU rows: [g0, u0, g1, u1, ...]."""
    return torch.stack([gate, up], dim=1).reshape(-1, gate.shape[1])


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
    """Per query group: its query heads, its key, its value (MindFormers' and Megatron's linear_qkv)."""
    return torch.cat([torch.cat([qg, kg, vg]) for qg, kg, vg in zip(q.chunk(groups), k.chunk(groups),
                                                                     v.chunk(groups), strict=True)])


def test_a_hugging_face_qwen3_reaches_mindformers_with_every_tensor_equal_by_name(tmp_path: Path) -> None:
    make_hf_checkpoint(QWEN3, tmp_path / "hf", seed=2)
    summary = convert_checkpoint(tmp_path / "hf", tmp_path / "mf", source="hf", target="mindformers", spec="qwen3",
                                 model=QWEN3)
    assert summary.notes == ("hf -> mindformers through Megatron's names",)
    hf, mf = _read("hf", tmp_path / "hf"), _read("mindformers", tmp_path / "mf")
    expected = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
                "decoder.final_layernorm.weight": hf["model.norm.weight"], "output_layer.weight": hf["lm_head.weight"]}
    for i in range(QWEN3.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        expected |= {
            f"{m}input_layernorm.weight": hf[f"{h}input_layernorm.weight"],
            f"{m}self_attention.linear_qkv.weight": _grouped(hf[f"{h}self_attn.q_proj.weight"],
                                                             hf[f"{h}self_attn.k_proj.weight"],
                                                             hf[f"{h}self_attn.v_proj.weight"], QWEN3.query_groups),
            f"{m}self_attention.q_layernorm.weight": hf[f"{h}self_attn.q_norm.weight"],
            f"{m}self_attention.k_layernorm.weight": hf[f"{h}self_attn.k_norm.weight"],
            f"{m}self_attention.linear_proj.weight": hf[f"{h}self_attn.o_proj.weight"],
            f"{m}pre_mlp_layernorm.weight": hf[f"{h}post_attention_layernorm.weight"],
            f"{m}mlp.linear_fc1.weight": _interleave(hf[f"{h}mlp.gate_proj.weight"], hf[f"{h}mlp.up_proj.weight"]),
            f"{m}mlp.linear_fc2.weight": hf[f"{h}mlp.down_proj.weight"],
        }
    assert set(mf) == set(expected)
    assert [k for k in expected if not torch.equal(mf[k], expected[k])] == []
    # and back: every Hugging Face tensor bit for bit, config.json given by the model
    convert_checkpoint(tmp_path / "mf", tmp_path / "hf2", source="mindformers", target="hf", spec="qwen3", model=QWEN3)
    back = _read("hf", tmp_path / "hf2")
    assert set(back) == set(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_gqa_llama_converts_to_megatron_and_back_through_dcp(tmp_path: Path) -> None:
    make_hf_checkpoint(LLAMA_GQA, tmp_path / "hf", seed=3)
    convert_checkpoint(tmp_path / "hf", tmp_path / "mg", source="hf", target="megatron", spec="gpt-dense",
                       model=LLAMA_GQA)
    convert_checkpoint(tmp_path / "hf", tmp_path / "dcp", source="hf", target="dcp")
    assert (tmp_path / "dcp" / ".metadata").is_file()
    convert_checkpoint(tmp_path / "dcp", tmp_path / "mg2", source="dcp", target="megatron", spec="gpt-dense",
                       model=LLAMA_GQA)
    mg, mg2 = _read("megatron", tmp_path / "mg"), _read("megatron", tmp_path / "mg2")
    assert set(mg) == set(mg2) == set(build_plan(load_spec("gpt-dense"), LLAMA_GQA).targets)
    assert all(torch.equal(mg[k], mg2[k]) for k in mg)
    hf = _read("hf", tmp_path / "hf")
    qkv = mg["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert torch.equal(qkv, _grouped(hf["model.layers.0.self_attn.q_proj.weight"],
                                     hf["model.layers.0.self_attn.k_proj.weight"],
                                     hf["model.layers.0.self_attn.v_proj.weight"], 2))
    convert_checkpoint(tmp_path / "mg", tmp_path / "hf2", source="megatron", target="hf", spec="gpt-dense",
                       model=LLAMA_GQA)
    back = _read("hf", tmp_path / "hf2")
    assert all(torch.equal(back[k], hf[k]) for k in hf)
    # transformers reads what was written (config.json from the model, the weights strictly)
    import transformers

    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf2"), dtype=torch.float32)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert all(torch.equal(loaded.state_dict()[k], hf[k]) for k in hf)


def test_a_checkpoint_of_another_model_is_refused_with_every_problem_and_nothing_written(tmp_path: Path) -> None:
    make_hf_checkpoint(LLAMA_GQA, tmp_path / "hf", seed=4)
    other = LLAMA_GQA.model_copy(update={"num_layers": 3, "ffn_hidden_size": 128})
    with pytest.raises(ConversionError) as err:
        convert_checkpoint(tmp_path / "hf", tmp_path / "mg", source="hf", target="megatron", spec="gpt-dense",
                           model=other)
    text = str(err.value)
    assert "missing Hugging Face key 'model.layers.2.input_layernorm.weight'" in text
    assert "wrong shape 'model.layers.0.mlp.gate_proj.weight': the checkpoint has [96, 64]" in text
    assert not (tmp_path / "mg").exists()
    with pytest.raises(ConfigError, match="no transformers class alignflow maps implements it"):
        hf_architecture(load_spec("twin-moe").model)
