"""Hugging Face checkpoints of the model families alignflow ships: transformers' own config and model classes.

A Hugging Face checkpoint is a `save_pretrained` directory: `config.json` (the transformers config class's
`to_json_string`) and `model.safetensors` (or shards with `model.safetensors.index.json`). For a model alignflow
describes (`ModelConfig`), the config class is the family's transformers class: a dense Llama-style GPT is
`LlamaForCausalLM`, the same with q/k RMSNorm over the head dimension is `Qwen3ForCausalLM`. A base checkpoint made
"on first use" (`base.generate`) is that class's own random initialisation, saved by its own `save_pretrained`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from alignflow.config.model import ModelConfig
from alignflow.errors import ConfigError

CONFIG_JSON = "config.json"


def hf_architecture(model: ModelConfig) -> tuple[str, str]:
    """(config class, model class) of transformers that is `model`; `ConfigError` for a model no shipped
    transformers class implements (what each needs is checked field by field)."""
    problems = []
    if model.moe is not None or model.mtp is not None or model.mla is not None or model.dsa is not None \
            or model.linear_attention is not None:
        problems.append("a dense model without MoE, MTP, MLA, DSA or linear attention")
    if model.normalization != "RMSNorm" or model.zero_centered_gamma:
        problems.append("RMSNorm (not zero-centred)")
    if not model.gated_linear_unit or model.activation != "silu":
        problems.append("SwiGLU (gated_linear_unit, silu)")
    if model.add_bias_linear or model.attention_output_gate:
        problems.append("no linear biases and no attention output gate")
    if model.position_embedding_type != "rope" or model.rotary_percent != 1.0:
        problems.append("full RoPE")
    if problems:
        raise ConfigError(f"model {model.family}: no transformers class alignflow maps implements it; Llama / Qwen3 "
                          f"need {'; '.join(problems)}")
    return ("Qwen3Config", "Qwen3ForCausalLM") if model.qk_layernorm else ("LlamaConfig", "LlamaForCausalLM")


def hf_config(model: ModelConfig) -> Any:
    """The transformers config of `model` (its family's config class)."""
    import transformers

    config_class, _ = hf_architecture(model)
    fields: dict[str, Any] = dict(
        vocab_size=model.vocab_size, hidden_size=model.hidden_size, intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.num_layers, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.query_groups, head_dim=model.head_dim,
        max_position_embeddings=model.max_position_embeddings or model.seq_length, rope_theta=model.rotary_base,
        rms_norm_eps=model.norm_epsilon, tie_word_embeddings=not model.untie_embeddings_and_output_weights,
        hidden_act="silu", attention_dropout=model.attention_dropout, initializer_range=model.init_method_std,
    )
    if config_class == "LlamaConfig":
        fields |= {"attention_bias": False, "mlp_bias": False}
    _, model_class = hf_architecture(model)
    return getattr(transformers, config_class)(architectures=[model_class], **fields)


def config_json(model: ModelConfig) -> str:
    """`config.json` of a Hugging Face checkpoint of `model`, as transformers writes it."""
    text: str = hf_config(model).to_json_string(use_diff=False)
    return text


def make_hf_checkpoint(model: ModelConfig, path: Path, *, seed: int) -> None:
    """Write a Hugging Face checkpoint of `model` with random weights (the family's class's own initialisation,
    seeded) through its own `save_pretrained`."""
    import torch
    import transformers

    _, model_class = hf_architecture(model)
    config = hf_config(model)
    torch.manual_seed(seed)
    net = getattr(transformers, model_class)(config)
    bars = transformers.utils.logging.is_progress_bar_enabled()  # a run's output is its own lines, not a shard bar
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        net.save_pretrained(str(path), safe_serialization=True)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def read_config(path: Path) -> dict[str, Any] | None:
    """The `config.json` of a Hugging Face checkpoint directory, if it has one."""
    file = path / CONFIG_JSON
    if not file.is_file():
        return None
    data = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but a {type(data).__name__}")
    return data
