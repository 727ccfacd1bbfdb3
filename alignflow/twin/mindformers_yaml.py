"""The MindSpore twin's YAML: MindFormers PyNative key names (`pynative/config/config.py`), validated strictly.

Sections and keys are MindFormers 2.1.0's `TrainConfig` (checkpoint, training, optimizer, lr_scheduler,
train_dataset, model, context); model hyper-parameters sit under `model.model_config` with megatron-core
`TransformerConfig` names, as MindFormers' mcore models take them. Every key the twin does not know is an error
naming its file, line and dotted path (MindFormers only rejects unknown keys in its fixed sections; the twin is
stricter, so a typo cannot silently change the run). The one twin extension is the `twin:` section
(`twin.data_sha256`: the data file must hash to it).

`model_config_from_mindformers` reads the architecture back as a `ModelConfig` (the MindSpore twin builds its
model from it). Preflight does not use it: `alignflow.preflight.npu` reads the YAML keys itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alignflow.config.model import ModelConfig, MoEConfig, MTPConfig
from alignflow.config.yamlsource import load_yaml, validate
from alignflow.errors import ConfigError
from alignflow.twin.schedule import DecayStyle, LRSchedule

_HEX = frozenset("0123456789abcdef")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContextSection(_Strict):
    mode: Literal[1] = Field(1, description="1 = PyNative, the only mode of the twin (MindFormers `--mode 1`).")
    device_target: Literal["CPU", "Ascend"] = Field("CPU", description="MindSpore device.")
    max_device_memory: str = Field("59GB", description="Device memory MindSpore may use; the twin ends with "
                                   "MindSpore's out-of-memory error when its memory model of a step exceeds it.")


class TrainingSection(_Strict):
    steps: int = Field(1000, ge=1, description="Total training steps.")
    local_batch_size: int = Field(1, ge=1, description="Samples per micro-batch.")
    global_batch_size: int = Field(1, ge=1, description="Samples per step (multiple of local_batch_size).")
    max_norm: float = Field(1.0, ge=0, description="Clip by global norm; the logged grad_norm is pre-clip.")
    seed: int = Field(42, ge=0, description="Seed of parameter initialisation (set_seed).")
    deterministic: bool = Field(False, description="mindspore.set_deterministic.")


class CheckpointSection(_Strict):
    enable_save: bool = Field(True, description="Save checkpoints.")
    save_path: str = Field("", description="Directory receiving iteration_%08d/ and the tracker.")
    save_max: int = Field(5, ge=1, description="Newest checkpoints of this run to keep.")
    save_interleaved_steps: int = Field(1000, ge=1, description="Save every N steps (and at the end).")
    no_save_optim: bool = Field(False, description="Skip the optimizer file.")
    async_save: Literal[False] = Field(False, description="Synchronous saving only.")
    prefix: str | None = Field("checkpoint", description="File prefix: <prefix>-model-%07d-%07d.safetensors.")
    remove_redundancy: bool = Field(False, description="Accepted; one rank has no redundancy.")
    load_path: str = Field("", description="Checkpoint dir (tracker) or iteration dir; empty = initialise.")
    load_balanced: bool = Field(False, description="Accepted; one rank.")
    no_load_optim: bool = Field(False, description="Weights only (True) or full resume (False).")
    load_worker_number: int = Field(1, ge=1, description="Accepted; one loader.")
    save_global_layout_cache: bool = Field(True, description="Accepted; no layout cache on one rank.")


class OptimizerSection(_Strict):
    type: Literal["AdamW"] = Field("AdamW", description="Optimizer (AdamW only).")
    betas: tuple[float, float] = Field((0.9, 0.95), description="Adam betas.")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon.")
    weight_decay: float = Field(0.01, ge=0, description="Decoupled weight decay (matrices only).")


class LrSchedulerSection(_Strict):
    type: Literal["ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR"] = Field(
        description="Schedule: linear warm-up, then constant, linear or cosine decay.")
    learning_rate: float = Field(1e-5, gt=0, description="Peak learning rate.")
    warmup_steps: int | None = Field(None, ge=0, description="Warm-up steps.")
    warmup_ratio: float | None = Field(None, ge=0, le=1, description="Warm-up as a fraction of training.steps.")
    warmup_lr_init: float = Field(0.0, ge=0, description="Learning rate at step 0.")
    lr_end: float = Field(0.0, ge=0, description="Final learning rate of the decay.")
    decay_steps: int | None = Field(None, ge=1, description="Decay length; default training.steps.")
    num_cycles: float = Field(0.5, description="Cosine half-cycle (0.5, the only shape the twin implements).")

    @field_validator("num_cycles")
    @classmethod
    def _half_cycle(cls, value: float) -> float:
        if value != 0.5:
            raise ValueError("the twin implements the half cosine cycle only (0.5), as Megatron's cosine decay")
        return value


class DataConfigSection(_Strict):
    seed: int = Field(1234, ge=0, description="Sample-order seed (Megatron --seed for data).")
    seq_length: int = Field(ge=1, description="Tokens per sample; must equal model_config.seq_length.")
    split: str = Field("1, 0, 0", description="Train/valid/test weights; the twin trains on everything.")
    data_path: list[str] | str = Field(description="['1', <dataset prefix>] or the prefix (<prefix>.bin + .idx).")
    eod: int | None = Field(None, description="End-of-document id (informational).")
    pad: int = Field(-1, description="Pad id (informational).")
    eod_mask_loss: Literal[False] = Field(False, description="Loss on every token.")
    reset_position_ids: Literal[False] = Field(False, description="Positions 0..s-1.")
    create_attention_mask: Literal[False] = Field(False, description="Causal mask built in the model.")
    reset_attention_mask: Literal[False] = Field(False, description="Causal over the whole sample.")
    create_compressed_eod_mask: Literal[False] = Field(False, description="Not used.")
    eod_pad_length: int = Field(128, description="Accepted; unused.")


class DataloaderSection(_Strict):
    type: Literal["BlendedMegatronDatasetDataLoader"] = Field(description="Megatron-style dataset loader.")
    datasets_type: Literal["GPTDataset"] = Field("GPTDataset", description="GPTDataset sample construction.")
    sizes: list[int] | None = Field(None, description="[train, test, eval] sample counts (informational).")
    column_names: list[str] = Field(default_factory=lambda: ["input_ids", "labels"], description="Columns.")
    shuffle: Literal[False] = Field(False, description="No extra shuffle: the GPTDataset order is the order.")
    python_multiprocessing: bool = Field(False, description="Accepted; unused.")
    config: DataConfigSection = Field(description="GPTDataset settings.")


class TrainDatasetSection(_Strict):
    dataloader: DataloaderSection = Field(description="Loader.")
    drop_remainder: bool = Field(True, description="Accepted; batches are always full.")
    num_parallel_workers: int = Field(8, description="Accepted; unused.")
    prefetch_size: int = Field(1, description="Accepted; unused.")
    numa_enable: bool = Field(False, description="Accepted; unused.")


class ModelConfigSection(_Strict):
    """`model.model_config`: megatron-core TransformerConfig names, as MindFormers mcore models use them."""

    vocab_size: int = Field(ge=1, description="Vocabulary (embedding rows).")
    seq_length: int = Field(ge=1, description="Tokens per sample.")
    hidden_size: int = Field(ge=1, description="Hidden size.")
    num_layers: int = Field(ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(ge=1, description="Query heads.")
    num_query_groups: int | None = Field(None, ge=1, description="KV groups (GQA); None = MHA.")
    kv_channels: int | None = Field(None, ge=1, description="Head dim; None = hidden/heads.")
    ffn_hidden_size: int = Field(ge=1, description="Dense FFN size.")
    normalization: Literal["RMSNorm", "LayerNorm"] = Field("RMSNorm", description="Norm type.")
    layernorm_epsilon: float = Field(1e-5, gt=0, description="Norm epsilon.")
    position_embedding_type: Literal["rope", "none"] = Field("rope", description="Position embedding.")
    rotary_base: float = Field(10000.0, gt=0, description="RoPE base.")
    rotary_percent: float = Field(1.0, gt=0, le=1, description="Partial RoPE fraction.")
    hidden_act: Literal["silu", "gelu", "swiglu"] = Field("silu", description="MLP activation (swiglu = silu with "
                                                          "the GLU, as MindFormers spells it for the fused kernel).")
    bias_swiglu_fusion: bool = Field(False, description="Fused SwiGLU (MindFormers: needs hidden_act swiglu); the twin "
                                     "computes it as Megatron's SwiGLUFunction, with its hand-written backward.")
    gated_linear_unit: bool = Field(True, description="GLU MLP (SwiGLU).")
    add_bias_linear: bool = Field(False, description="Linear biases.")
    qk_layernorm: bool = Field(False, description="RMSNorm of q and k over head_dim before RoPE (Qwen3).")
    untie_embeddings_and_output_weights: bool = Field(True, description="Separate output layer.")
    hidden_dropout: float = Field(0.0, ge=0, le=1, description="Hidden dropout.")
    attention_dropout: float = Field(0.0, ge=0, le=1, description="Attention dropout.")
    init_method_std: float = Field(0.02, gt=0, description="Initialisation std.")
    params_dtype: Literal["float32", "bfloat16"] = Field("float32", description="bfloat16 = round parameters to "
                                                          "bf16 after each update (fp32 master kept).")
    compute_dtype: Literal["float32"] = Field("float32", description="The twin computes in fp32 (CPU kernels).")
    use_interleaved_weight_layout_mlp: Literal[True] = Field(True, description="fc1 rows [g0,u0,g1,u1,...].")
    num_moe_experts: int | None = Field(None, ge=1, description="Routed experts; None = dense model.")
    moe_router_topk: int = Field(2, ge=1, description="Experts per token.")
    moe_ffn_hidden_size: int | None = Field(None, ge=1, description="Routed expert FFN size.")
    moe_shared_expert_intermediate_size: int | None = Field(None, ge=1, description="Shared expert FFN size.")
    moe_shared_expert_gate: bool = Field(False, description="Sigmoid gate on the shared expert.")
    moe_router_score_function: Literal["softmax", "sigmoid"] = Field("softmax", description="Router scores.")
    norm_topk_prob: bool = Field(True, description="Renormalise top-k probabilities (Megatron always does).")
    moe_router_enable_expert_bias: bool = Field(False, description="Aux-loss-free expert bias.")
    moe_router_bias_update_rate: float = Field(1e-3, ge=0, description="Expert-bias update step.")
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "none"] = Field(
        "aux_loss", description="Load-balancing loss.")
    moe_aux_loss_coeff: float = Field(0.0, ge=0, description="Aux-loss coefficient.")
    moe_router_topk_scaling_factor: float | None = Field(None, description="Scale of the routed probabilities.")
    moe_layer_freq: int | list[int] = Field(1, description="Every N-th layer MoE, or a 0/1 list per layer.")
    mtp_num_layers: int | None = Field(None, ge=1, description="MTP depth; None = no MTP.")
    mtp_loss_scaling_factor: float = Field(0.1, ge=0, description="MTP loss weight.")


class RecomputeSection(_Strict):
    """MindFormers 2.1 PyNative `RecomputeConfig`: `full` recomputes every decoder layer in the backward pass."""

    mode: Literal["None", "full"] = Field("None", description="Recompute mode (`select` is not implemented by the "
                                          "twin).")


class ModelSection(_Strict):
    model_type: str = Field("twin", description="Model type; becomes ModelConfig.family.")
    architectures: str = Field("TwinGPTForCausalLM", description="Informational.")
    # `model_config` is pydantic's own attribute name: the field is `arch`, spelled model_config in the YAML
    arch: ModelConfigSection = Field(alias="model_config", description="Architecture.")


class TwinSection(_Strict):
    data_sha256: str | None = Field(None, description="sha256 the data file must have (twin extension).")
    jit: bool = Field(True, description="Compile forward+backward and the optimizer with mindspore.jit.")

    @field_validator("data_sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != 64 or not set(value.lower()) <= _HEX):
            raise ValueError("must be 64 hexadecimal characters")
        return value.lower() if value else value


class MindFormersConfig(_Strict):
    """A whole twin YAML (`python -m alignflow.twin.mindspore_train --config X.yaml --mode 1`)."""

    context: ContextSection = Field(default_factory=ContextSection, description="MindSpore context.")
    training: TrainingSection = Field(default_factory=TrainingSection, description="Training scale.")
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection, description="Save / load.")
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="Optimizer.")
    lr_scheduler: LrSchedulerSection = Field(description="Learning-rate schedule.")
    train_dataset: TrainDatasetSection = Field(description="Data.")
    model: ModelSection = Field(description="Model.")
    recompute: RecomputeSection = Field(default_factory=RecomputeSection, description="Activation recomputation.")
    twin: TwinSection = Field(default_factory=TwinSection, description="Twin extensions.")

    @property
    def data_file(self) -> str:
        path = self.train_dataset.dataloader.config.data_path
        return path if isinstance(path, str) else path[-1]

    def lr_schedule(self) -> LRSchedule:
        s, steps = self.lr_scheduler, self.training.steps
        warmup = int(s.warmup_ratio * steps) if s.warmup_ratio is not None else (s.warmup_steps or 0)
        style: DecayStyle = {"ConstantWarmUpLR": "constant", "LinearWithWarmUpLR": "linear",
                             "CosineWithWarmUpLR": "cosine"}[s.type]  # type: ignore[assignment]
        return LRSchedule(max_lr=s.learning_rate, min_lr=s.lr_end, warmup_steps=warmup,
                          decay_steps=s.decay_steps or steps, style=style, init_lr=s.warmup_lr_init)


def load_mindformers_config(path: str | Path) -> MindFormersConfig:
    """Read and validate a twin YAML; every problem is reported as `file:line: dotted.key: message`."""
    doc = load_yaml(path)
    cfg = validate(MindFormersConfig, doc)
    problems: list[tuple[str, int | None, str]] = []

    def check(bad: bool, key: tuple[str, ...], message: str) -> None:
        if bad:
            problems.append((str(doc.path), doc.line_of(key), f"{'.'.join(key)}: {message}"))

    dl = cfg.train_dataset.dataloader.config
    mc = cfg.model.arch
    check(dl.seq_length != mc.seq_length, ("train_dataset", "dataloader", "config", "seq_length"),
          f"{dl.seq_length} differs from model.model_config.seq_length {mc.seq_length}")
    check(cfg.training.global_batch_size % cfg.training.local_batch_size != 0, ("training", "global_batch_size"),
          "must be a multiple of training.local_batch_size (one rank)")
    check(mc.bias_swiglu_fusion and mc.hidden_act != "swiglu", ("model", "model_config", "bias_swiglu_fusion"),
          "When using bias_swiglu_fusion, hidden_act must be swiglu. (MindFormers TransformerConfig)")
    data_path = dl.data_path
    check(isinstance(data_path, list) and len(data_path) not in (1, 2),
          ("train_dataset", "dataloader", "config", "data_path"), "expected ['1', <dataset prefix>]")
    try:
        fractions = [float(x) for x in dl.split.split(",") if x.strip()]
        check(not fractions or fractions[0] <= 0 or any(f != 0 for f in fractions[1:]),
              ("train_dataset", "dataloader", "config", "split"), "the twin trains on the whole file: use '1, 0, 0'")
    except ValueError:
        check(True, ("train_dataset", "dataloader", "config", "split"), f"{dl.split!r} is not a list of weights")
    if problems:
        raise ConfigError(problems)
    return cfg


def model_config_from_mindformers(cfg: MindFormersConfig) -> ModelConfig:
    """The `ModelConfig` a twin / MindFormers YAML describes."""
    mc = cfg.model.arch
    moe = None
    if mc.num_moe_experts:
        freq = mc.moe_layer_freq
        layer_freq = freq if isinstance(freq, list) else [1 if i % freq == 0 else 0 for i in range(mc.num_layers)]
        moe = MoEConfig(
            num_experts=mc.num_moe_experts, router_topk=mc.moe_router_topk,
            ffn_hidden_size=mc.moe_ffn_hidden_size or mc.ffn_hidden_size,
            shared_expert_intermediate_size=mc.moe_shared_expert_intermediate_size,
            shared_expert_gate=mc.moe_shared_expert_gate, router_score_function=mc.moe_router_score_function,
            norm_topk_prob=mc.norm_topk_prob, router_enable_expert_bias=mc.moe_router_enable_expert_bias,
            router_bias_update_rate=mc.moe_router_bias_update_rate,
            router_topk_scaling_factor=mc.moe_router_topk_scaling_factor,
            load_balancing_type=mc.moe_router_load_balancing_type, aux_loss_coeff=mc.moe_aux_loss_coeff,
            layer_freq=layer_freq,
        )
    try:
        return ModelConfig(
            family=cfg.model.model_type, num_layers=mc.num_layers, hidden_size=mc.hidden_size,
            ffn_hidden_size=mc.ffn_hidden_size, num_attention_heads=mc.num_attention_heads,
            num_query_groups=mc.num_query_groups, kv_channels=mc.kv_channels, vocab_size=mc.vocab_size,
            make_vocab_size_divisible_by=1, seq_length=mc.seq_length,
            position_embedding_type=mc.position_embedding_type, rotary_base=mc.rotary_base,
            rotary_percent=mc.rotary_percent, normalization=mc.normalization, norm_epsilon=mc.layernorm_epsilon,
            activation="silu" if mc.hidden_act == "swiglu" else mc.hidden_act,
            gated_linear_unit=mc.gated_linear_unit or mc.hidden_act == "swiglu", add_bias_linear=mc.add_bias_linear,
            qk_layernorm=mc.qk_layernorm, untie_embeddings_and_output_weights=mc.untie_embeddings_and_output_weights,
            hidden_dropout=mc.hidden_dropout, attention_dropout=mc.attention_dropout,
            init_method_std=mc.init_method_std, moe=moe,
            mtp=MTPConfig(num_layers=mc.mtp_num_layers, loss_scaling_factor=mc.mtp_loss_scaling_factor)
            if mc.mtp_num_layers else None,
        )
    except ValueError as exc:
        raise ConfigError(f"model.model_config: inconsistent: {exc}") from None
