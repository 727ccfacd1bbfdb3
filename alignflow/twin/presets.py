"""The twin's model presets and the checked, framework-neutral shape both sides build from.

`ModelConfig` describes every architecture alignflow can align; the twin implements a small subset of it
(GQA + RoPE + RMSNorm + SwiGLU, optional q/k RMSNorm, optional MoE with a shared expert, optional MTP).
`twin_spec` turns a `ModelConfig` into a `TwinSpec` and refuses, field by field, whatever the twin does not
implement — a model the twin silently simplified would make every comparison downstream meaningless.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from alignflow.config.model import ModelConfig
from alignflow.convert.dims import model_field
from alignflow.errors import ConfigError

DEFAULT_PRESET = "twin-moe"


@dataclass(frozen=True, slots=True)
class MoESpec:
    """The routed-expert part of an MoE layer (identical in every MoE layer of the twin)."""

    num_experts: int
    topk: int
    ffn_hidden_size: int
    shared_ffn_hidden_size: int | None
    shared_expert_gate: bool
    score_function: Literal["softmax", "sigmoid"]
    expert_bias: bool
    bias_update_rate: float
    aux_loss_coeff: float  # 0.0 = no load-balancing loss (load_balancing_type "none")
    topk_scaling_factor: float | None
    norm_topk_prob: bool = True  # False only through a fault injection (alignflow.twin.faults): Megatron renormalises


@dataclass(frozen=True, slots=True)
class TwinSpec:
    """Everything both sides need to build the same network; derived from a `ModelConfig` by `twin_spec`."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    ffn_hidden_size: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    seq_length: int
    rotary_base: float
    norm_eps: float
    init_std: float
    moe: MoESpec | None
    moe_layers: tuple[bool, ...]
    mtp_num_layers: int
    mtp_loss_scaling_factor: float
    qk_layernorm: bool = False  # RMSNorm over head_dim of q and k before RoPE (Qwen3; Megatron --qk-layernorm)
    activation: str = "silu"  # "gelu" only through a fault injection (alignflow.twin.faults)
    # How the network is computed, not what it is (a side's switches, from its command line): the same mathematics
    # in another order. Decoder layers recomputed in the backward pass in chunks of this many (0: none) ...
    recompute_num_layers: int = 0
    # ... and SwiGLU as megatron's fused `SwiGLUFunction` (its hand-written backward) instead of autograd's.
    bias_swiglu_fusion: bool = False

    @property
    def num_moe_layers_for_logging(self) -> int:
        """Megatron divides the logged load-balancing loss by decoder MoE layers plus MTP layers
        (docs/megatron.md#loss-semantics)."""
        return sum(self.moe_layers) + (self.mtp_num_layers if self.mtp_inner_is_moe else 0)

    @property
    def mtp_inner_is_moe(self) -> bool:
        """The MTP inner layer has the spec of the last decoder layer (Megatron `decoder_layer_specs[-1]`)."""
        return self.moe_layers[-1]

    @property
    def qkv_rows(self) -> int:
        return (self.num_heads + 2 * self.num_query_groups) * self.head_dim


# (field path, is-unsupported predicate, what to do). A table, so that adding a feature removes one row.
_Check = tuple[str, Callable[[ModelConfig], bool], str]
_UNSUPPORTED: tuple[_Check, ...] = (
    ("mla", lambda m: m.mla is not None, "multi-latent attention is not implemented by the twin"),
    ("dsa", lambda m: m.dsa is not None, "the sparse-attention indexer is not implemented by the twin"),
    ("linear_attention", lambda m: m.linear_attention is not None, "linear attention is not implemented by the twin"),
    ("add_bias_linear", lambda m: m.add_bias_linear, "the twin has no linear biases; set it to false"),
    ("attention_output_gate", lambda m: m.attention_output_gate, "gated attention is not implemented by the twin"),
    ("zero_centered_gamma", lambda m: m.zero_centered_gamma, "the twin stores plain RMSNorm gamma"),
    ("normalization", lambda m: m.normalization != "RMSNorm", "the twin implements RMSNorm only"),
    ("activation", lambda m: m.activation != "silu", "the twin implements SwiGLU (silu) only"),
    ("gated_linear_unit", lambda m: not m.gated_linear_unit, "the twin implements SwiGLU (gated) MLPs only"),
    ("position_embedding_type", lambda m: m.position_embedding_type != "rope", "the twin implements RoPE only"),
    ("rotary_percent", lambda m: m.rotary_percent != 1.0, "partial RoPE is not implemented by the twin"),
    ("untie_embeddings_and_output_weights", lambda m: not m.untie_embeddings_and_output_weights,
     "the twin has an untied output layer"),
    ("hidden_dropout", lambda m: m.hidden_dropout != 0.0, "alignment runs need dropout 0"),
    ("attention_dropout", lambda m: m.attention_dropout != 0.0, "alignment runs need dropout 0"),
    ("moe.load_balancing_type", lambda m: m.moe is not None and m.moe.load_balancing_type == "seq_aux_loss",
     "the twin implements aux_loss and none"),
    ("moe.z_loss_coeff", lambda m: m.moe is not None and bool(m.moe.z_loss_coeff),
     "the router z-loss is not implemented by the twin"),
    ("moe.router_dtype", lambda m: m.moe is not None and m.moe.router_dtype == "bf16",
     "the twin routes in fp32"),
    ("moe.norm_topk_prob", lambda m: m.moe is not None and not m.moe.norm_topk_prob,
     "Megatron always renormalises the top-k probabilities (docs/seeds.md#moe-router-renormalisation-norm_topk_prob); "
     "the twin does the same"),
    ("moe.shared_expert_gate", lambda m: m.moe is not None and m.moe.shared_expert_gate
     and m.moe.shared_expert_intermediate_size is None, "a shared-expert gate needs a shared expert"),
)


def twin_spec(model: ModelConfig) -> TwinSpec:
    """Check that the twin implements `model` and derive its `TwinSpec`.

    Raises `ConfigError` listing every unsupported field (`model.<field>: <value>: <why>`).
    """
    problems = [
        ("", None, f"model.{path}: {model_field(model, path)!r}: {why}")
        for path, unsupported, why in _UNSUPPORTED
        if unsupported(model)
    ]
    if problems:
        raise ConfigError(problems)
    moe = None
    if model.moe is not None:
        m = model.moe
        moe = MoESpec(
            num_experts=m.num_experts,
            topk=m.router_topk,
            ffn_hidden_size=m.ffn_hidden_size,
            shared_ffn_hidden_size=m.shared_expert_intermediate_size,
            shared_expert_gate=m.shared_expert_gate,
            score_function=m.router_score_function,
            expert_bias=m.router_enable_expert_bias,
            bias_update_rate=m.router_bias_update_rate,
            aux_loss_coeff=m.aux_loss_coeff if m.load_balancing_type == "aux_loss" else 0.0,
            topk_scaling_factor=m.router_topk_scaling_factor,
        )
    return TwinSpec(
        family=model.family,
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        num_layers=model.num_layers,
        ffn_hidden_size=model.ffn_hidden_size,
        num_heads=model.num_attention_heads,
        num_query_groups=model.query_groups,
        head_dim=model.head_dim,
        seq_length=model.seq_length,
        rotary_base=model.rotary_base,
        norm_eps=model.norm_epsilon,
        init_std=model.init_method_std,
        moe=moe,
        moe_layers=tuple(model.is_moe_layer(i) for i in range(model.num_layers)),
        mtp_num_layers=model.mtp.num_layers if model.mtp is not None else 0,
        mtp_loss_scaling_factor=model.mtp.loss_scaling_factor if model.mtp is not None else 0.0,
        qk_layernorm=model.qk_layernorm,
    )


def _from_spec(name: str) -> ModelConfig:
    """The `model:` section of the packaged conversion spec `name` (alignflow/convert/specs/<name>.yaml)."""
    from alignflow.convert.registry import load_spec  # imported on use: the spec loader pulls in torch

    return load_spec(name).model  # frozen: safe to share from the cached spec


# The presets are the models of the twin conversion specs, declared once there (twin-moe.yaml and the files
# extending it): twin-moe is Qwen3.5-MoE style (softmax router, top-k renormalised, aux-loss balancing),
# twin-moe-bias GLM-5.2 / DeepSeek-V3 style (sigmoid scores + aux-loss-free expert bias), twin-dense the same
# shapes with every layer dense (FFN 256) and a dense MTP inner layer.
PRESETS: dict[str, Callable[[], ModelConfig]] = {
    name: partial(_from_spec, name) for name in ("twin-moe", "twin-moe-bias", "twin-dense", "qwen3")
}


def preset(name: str = DEFAULT_PRESET) -> ModelConfig:
    """The `ModelConfig` of a named twin preset."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown twin preset {name!r}; presets are: {', '.join(PRESETS)}") from None
