"""The model and training sections of an experiment: one description that both sides are rendered from.

Names follow megatron-core's `TransformerConfig` / `pretrain_gpt.py` flags where one exists, so that a reader
can map each field to a Megatron flag and a MindFormers YAML key (the renderers do exactly that, and preflight
reads both renderings back to prove they agree).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from alignflow.config.parallel import ParallelConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MoEConfig(_Strict):
    """Mixture-of-experts settings (Megatron `--num-experts`, `--moe-*`)."""

    num_experts: int = Field(ge=1, description="Routed experts per MoE layer.")
    router_topk: int = Field(ge=1, description="Experts chosen per token (`--moe-router-topk`).")
    ffn_hidden_size: int = Field(ge=1, description="FFN size of one routed expert (`--moe-ffn-hidden-size`).")
    shared_expert_intermediate_size: int | None = Field(
        None, ge=1, description="FFN size of the shared expert(s); None = no shared expert."
    )
    shared_expert_gate: bool = Field(
        False, description="Sigmoid gate on the shared expert (`--moe-shared-expert-gate`)."
    )
    router_score_function: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="Router score function (`--moe-router-score-function`)."
    )
    norm_topk_prob: bool = Field(
        True, description="Renormalise the top-k probabilities; Megatron always does for softmax with top-k > 1."
    )
    router_enable_expert_bias: bool = Field(
        False, description="Aux-loss-free expert bias (DeepSeek-V3 / GLM style); Megatron needs sigmoid scores."
    )
    router_bias_update_rate: float = Field(
        1e-3, ge=0, description="Step of the aux-loss-free expert-bias update (`--moe-router-bias-update-rate`)."
    )
    router_topk_scaling_factor: float | None = Field(None, description="`--moe-router-topk-scaling-factor`.")
    load_balancing_type: Literal["aux_loss", "seq_aux_loss", "none"] = Field(
        "aux_loss", description="`--moe-router-load-balancing-type`."
    )
    aux_loss_coeff: float = Field(0.0, ge=0, description="`--moe-aux-loss-coeff`.")
    z_loss_coeff: float | None = Field(None, ge=0, description="`--moe-z-loss-coeff`; None = off.")
    layer_freq: list[int] | None = Field(
        None, description="Per decoder layer: 1 = MoE, 0 = dense (`--moe-layer-freq`); None = every layer MoE."
    )
    router_dtype: Literal["fp32", "bf16"] | None = Field(None, description="`--moe-router-dtype`.")

    @model_validator(mode="after")
    def _checks(self) -> MoEConfig:
        if self.router_topk > self.num_experts:
            raise ValueError(f"router_topk {self.router_topk} exceeds num_experts {self.num_experts}")
        if self.router_enable_expert_bias and self.router_score_function != "sigmoid":
            raise ValueError("router_enable_expert_bias needs router_score_function: sigmoid (as Megatron requires)")
        return self


class MTPConfig(_Strict):
    """Multi-token prediction (Megatron `--mtp-num-layers`, `--mtp-loss-scaling-factor`)."""

    num_layers: int = Field(1, ge=1, description="MTP depth.")
    loss_scaling_factor: float = Field(0.1, ge=0, description="Weight of the MTP loss in the total loss.")


class LinearAttentionConfig(_Strict):
    """Gated DeltaNet linear attention (Qwen3.5); Megatron `--experimental-attention-variant gated_delta_net`."""

    freq: int = Field(description="Every `freq`-th layer is full attention (`--linear-attention-freq`).")
    conv_kernel_dim: int = Field(4, description="`--linear-conv-kernel-dim`.")
    key_head_dim: int = Field(description="`--linear-key-head-dim`.")
    value_head_dim: int = Field(description="`--linear-value-head-dim`.")
    num_key_heads: int = Field(description="`--linear-num-key-heads`.")
    num_value_heads: int = Field(description="`--linear-num-value-heads`.")


class MLAConfig(_Strict):
    """Multi-latent attention (GLM-5.2 / DeepSeek style); Megatron `--multi-latent-attention`."""

    q_lora_rank: int | None = Field(None, description="`--q-lora-rank`; None = no q down-projection.")
    kv_lora_rank: int = Field(description="`--kv-lora-rank`.")
    qk_head_dim: int = Field(description="`--qk-head-dim` (no-position part).")
    qk_pos_emb_head_dim: int = Field(description="`--qk-pos-emb-head-dim` (RoPE part).")
    v_head_dim: int = Field(description="`--v-head-dim`.")


class DSAConfig(_Strict):
    """DeepSeek sparse attention indexer (GLM-5.2)."""

    index_n_heads: int = Field(description="Indexer heads.")
    index_head_dim: int = Field(128, description="Indexer head dim.")
    index_topk: int = Field(description="Tokens kept per query.")
    indexer_loss_coeff: float = Field(
        0.0, ge=0, description="Weight of the indexer's KL loss in the total loss (`--dsa-indexer-loss-coeff`, always "
        "rendered: megatron-core 0.18 reads an unset one as None and fails in the first forward, dsa.py:250).")


class ModelConfig(_Strict):
    """Architecture of the model both sides train."""

    family: str = Field(description="Model family; names the conversion spec and the twin preset (e.g. twin-moe).")
    num_layers: int = Field(ge=1, description="Decoder layers (`--num-layers`).")
    hidden_size: int = Field(ge=1, description="`--hidden-size`.")
    ffn_hidden_size: int = Field(ge=1, description="Dense FFN size (`--ffn-hidden-size`).")
    num_attention_heads: int = Field(ge=1, description="`--num-attention-heads`.")
    num_query_groups: int | None = Field(None, ge=1, description="GQA groups (`--num-query-groups`); None = MHA.")
    kv_channels: int | None = Field(None, ge=1, description="Head dim (`--kv-channels`); None = hidden/heads.")
    vocab_size: int = Field(ge=1, description="Vocabulary size the NPU side uses.")
    make_vocab_size_divisible_by: int = Field(
        128, ge=1, description="Megatron pads the vocabulary to a multiple of this; the padded size must equal "
        "vocab_size or the padded rows change the loss."
    )
    seq_length: int = Field(ge=1, description="Tokens per sample (`--seq-length`).")
    max_position_embeddings: int | None = Field(None, description="Default: seq_length.")
    position_embedding_type: Literal["rope", "none"] = Field("rope", description="`--position-embedding-type`.")
    rotary_base: float = Field(10000.0, gt=0, description="`--rotary-base`.")
    rotary_percent: float = Field(1.0, gt=0, le=1, description="`--rotary-percent` (partial RoPE).")
    normalization: Literal["RMSNorm", "LayerNorm"] = Field("RMSNorm", description="`--normalization`.")
    norm_epsilon: float = Field(1e-5, gt=0, description="`--norm-epsilon`.")
    zero_centered_gamma: bool = Field(False, description="`--apply-layernorm-1p` (gamma stored minus one).")
    activation: Literal["silu", "gelu"] = Field("silu", description="MLP activation; `--swiglu` = silu + GLU.")
    gated_linear_unit: bool = Field(True, description="GLU MLP (SwiGLU with silu).")
    add_bias_linear: bool = Field(False, description="Biases in linear layers (`--disable-bias-linear` when False).")
    qk_layernorm: bool = Field(False, description="`--qk-layernorm`.")
    attention_output_gate: bool = Field(False, description="`--attention-output-gate` (gated full attention).")
    untie_embeddings_and_output_weights: bool = Field(True, description="Separate output layer.")
    hidden_dropout: float = Field(0.0, ge=0, le=1, description="Must be 0 for alignment.")
    attention_dropout: float = Field(0.0, ge=0, le=1, description="Must be 0 for alignment.")
    init_method_std: float = Field(0.02, gt=0, description="Initialisation std of the base training.")
    moe: MoEConfig | None = Field(None, description="MoE settings; None = dense model.")
    mtp: MTPConfig | None = Field(None, description="MTP settings; None = no MTP.")
    linear_attention: LinearAttentionConfig | None = Field(None, description="Gated DeltaNet layers (Qwen3.5).")
    mla: MLAConfig | None = Field(None, description="Multi-latent attention (GLM-5.2).")
    dsa: DSAConfig | None = Field(None, description="Sparse attention indexer (GLM-5.2).")

    @model_validator(mode="after")
    def _checks(self) -> ModelConfig:
        groups = self.num_query_groups or self.num_attention_heads
        if self.num_attention_heads % groups:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_query_groups {groups}")
        if self.moe is not None and self.moe.layer_freq is not None and len(self.moe.layer_freq) != self.num_layers:
            raise ValueError(f"moe.layer_freq has {len(self.moe.layer_freq)} entries for {self.num_layers} layers")
        return self

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        """Megatron's padded vocabulary at TP=1 (`vocab_size_with_padding`)."""
        d = self.make_vocab_size_divisible_by
        return -(-self.vocab_size // d) * d

    def is_moe_layer(self, index: int) -> bool:
        if self.moe is None:
            return False
        return True if self.moe.layer_freq is None else bool(self.moe.layer_freq[index])


class TrainingConfig(_Strict):
    """Optimisation and data order, identical on both sides."""

    seed: int = Field(1234, ge=0, description="Seed of the data order (GPTDataset shuffle) and of initialisation.")
    base_steps: int = Field(10, ge=1, description="Steps of the NPU base training that produces the start weights.")
    steps: int = Field(ge=1, description="Steps of each alignment training (GPU and NPU reload).")
    lr: float = Field(gt=0, description="Peak learning rate.")
    min_lr: float = Field(0.0, ge=0, description="Final learning rate of the decay.")
    lr_warmup_iters: int = Field(0, ge=0, description="Linear warm-up steps.")
    lr_decay_style: Literal["constant", "cosine", "linear"] = Field("constant", description="Decay after warm-up.")
    lr_decay_iters: int | None = Field(None, ge=1, description="Decay length; default: steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, gt=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(0.95, gt=0, lt=1, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    clip_grad: float = Field(1.0, ge=0, description="Clip by global norm (0 = off); the logged norm is pre-clip.")
    micro_batch_size: int = Field(1, ge=1, description="Samples per micro-batch.")
    global_batch_size: int = Field(1, ge=1, description="Samples per step.")
    deterministic: bool = Field(True, description="Deterministic kernels on both sides.")
    bf16: bool = Field(True, description="bf16 compute (the twin computes in fp32 on CPU regardless).")
    # the computation switches are left out of the recorded configuration while off: a training without them keeps
    # the configuration (and fingerprint) it recorded before they existed (the nightly's baseline: the last pass of
    # the same one)
    recompute: Literal["none", "full"] = Field(
        "none", exclude_if=lambda v: v == "none",
        description="Activation recomputation: `full` recomputes every decoder layer in the backward pass "
        "(Megatron `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`, MindFormers "
        "`recompute: {mode: full}`). The same mathematics in another order: less activation memory, more time.")
    bias_swiglu_fusion: bool = Field(
        False, exclude_if=lambda v: not v,
        description="Fused SwiGLU kernel (Megatron without `--no-bias-swiglu-fusion`: its `SwiGLUFunction` "
        "with the hand-written backward; MindFormers `model_config.bias_swiglu_fusion`). The same mathematics, "
        "other roundings in the backward pass.")
    save_interval: int | None = Field(None, ge=1, description="Checkpoint interval of the base training; default: "
                                      "only at the end.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Parallel layout of both sides' "
                                     "trainings (tp, pp, ep, dp); a side may differ with npu.parallel / gpu.parallel.")

    @model_validator(mode="after")
    def _checks(self) -> TrainingConfig:
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(f"global_batch_size {self.global_batch_size} is not a multiple of micro_batch_size "
                             f"{self.micro_batch_size}")
        if self.lr_warmup_iters >= max(self.steps, 1) and self.lr_decay_style != "constant":
            raise ValueError(f"lr_warmup_iters {self.lr_warmup_iters} must be below steps {self.steps}")
        return self
