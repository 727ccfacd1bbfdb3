"""Render one experiment's model and training sections into the twin's two command lines.

`mindformers_config(...)` returns the MindFormers PyNative YAML (as a dict) for
`python -m alignflow.twin.mindspore_train --config X.yaml --mode 1`, and `twin_env(...)` the PyTorch twin's own
settings, which travel in its environment and never on a Megatron command line. Its flags are the Megatron
backend's own (`alignflow.backends.twin.megatron_args`), so the twin and a real Megatron-LM run get the same command
line.

Both sides get the same data (one Megatron indexed dataset), seed, split and sample count, so that their
`GPTDataset` orders agree.
"""

from __future__ import annotations

from typing import Any

from alignflow.config.model import ModelConfig, TrainingConfig

TWIN_DATA_SHA256 = "ALIGNFLOW_TWIN_DATA_SHA256"
TWIN_MEGATRON_VERSION = "ALIGNFLOW_TWIN_MEGATRON_VERSION"
TWIN_DEVICE = "ALIGNFLOW_TWIN_DEVICE"
# The device memory the PyTorch twin may use, in MiB (the CPU has no device to run out of: with this set, a twin
# whose modelled peak (`alignflow.twin.memory`) exceeds it ends with torch's CUDA out-of-memory error, as
# `torch.cuda.set_per_process_memory_fraction` would make a real run end).
TWIN_DEVICE_MEMORY = "ALIGNFLOW_TWIN_DEVICE_MEMORY_MB"

_SCHEDULERS = {"constant": "ConstantWarmUpLR", "linear": "LinearWithWarmUpLR", "cosine": "CosineWithWarmUpLR"}


def mindformers_config(
    model: ModelConfig,
    training: TrainingConfig,
    *,
    data_path: str,
    data_sha256: str | None,
    load_path: str | None,
    save_path: str | None,
    steps: int,
    save_interval: int | None = None,
    no_load_optim: bool = True,
    no_save_optim: bool = False,
    prefix: str = "checkpoint",
    device_target: str = "CPU",
    jit: bool = True,
) -> dict[str, Any]:
    """The MindSpore twin's YAML as a dict (dump it with `yaml.safe_dump(..., sort_keys=False)`)."""
    moe = model.moe
    model_config: dict[str, Any] = {
        "vocab_size": model.vocab_size, "seq_length": model.seq_length, "hidden_size": model.hidden_size,
        "num_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.query_groups, "kv_channels": model.head_dim,
        "ffn_hidden_size": model.ffn_hidden_size, "normalization": model.normalization,
        "layernorm_epsilon": model.norm_epsilon, "position_embedding_type": model.position_embedding_type,
        "rotary_base": model.rotary_base, "rotary_percent": model.rotary_percent, "hidden_act": model.activation,
        "gated_linear_unit": model.gated_linear_unit, "add_bias_linear": model.add_bias_linear,
        "qk_layernorm": model.qk_layernorm,
        "untie_embeddings_and_output_weights": model.untie_embeddings_and_output_weights,
        "hidden_dropout": model.hidden_dropout, "attention_dropout": model.attention_dropout,
        "init_method_std": model.init_method_std, "params_dtype": "bfloat16" if training.bf16 else "float32",
        "compute_dtype": "float32", "use_interleaved_weight_layout_mlp": True,
    }
    if training.bias_swiglu_fusion:  # MindFormers refuses the fusion unless hidden_act is swiglu (TransformerConfig)
        model_config |= {"hidden_act": "swiglu", "bias_swiglu_fusion": True}
    if moe is not None:
        model_config |= {
            "num_moe_experts": moe.num_experts, "moe_router_topk": moe.router_topk,
            "moe_ffn_hidden_size": moe.ffn_hidden_size,
            "moe_shared_expert_intermediate_size": moe.shared_expert_intermediate_size,
            "moe_shared_expert_gate": moe.shared_expert_gate,
            "moe_router_score_function": moe.router_score_function, "norm_topk_prob": moe.norm_topk_prob,
            "moe_router_enable_expert_bias": moe.router_enable_expert_bias,
            "moe_router_bias_update_rate": moe.router_bias_update_rate,
            "moe_router_load_balancing_type": moe.load_balancing_type, "moe_aux_loss_coeff": moe.aux_loss_coeff,
            "moe_router_topk_scaling_factor": moe.router_topk_scaling_factor,
            "moe_layer_freq": list(moe.layer_freq) if moe.layer_freq is not None else 1,
        }
    if model.mtp is not None:
        model_config |= {"mtp_num_layers": model.mtp.num_layers,
                         "mtp_loss_scaling_factor": model.mtp.loss_scaling_factor}
    lr_scheduler: dict[str, Any] = {
        "type": _SCHEDULERS[training.lr_decay_style], "learning_rate": training.lr,
        "warmup_steps": training.lr_warmup_iters, "warmup_lr_init": 0.0, "lr_end": training.min_lr,
    }
    if training.lr_decay_iters is not None:
        lr_scheduler["decay_steps"] = training.lr_decay_iters
    sections: dict[str, Any] = {}
    if training.recompute != "none":  # MindFormers 2.1 PyNative `TrainConfig.recompute` (RecomputeConfig.mode)
        sections["recompute"] = {"mode": training.recompute}
    return {
        "context": {"mode": 1, "device_target": device_target},
        "training": {"steps": steps, "local_batch_size": training.micro_batch_size,
                     "global_batch_size": training.global_batch_size, "max_norm": training.clip_grad,
                     "seed": training.seed, "deterministic": training.deterministic},
        "checkpoint": {"enable_save": save_path is not None, "save_path": save_path or "",
                       "save_interleaved_steps": save_interval or steps, "no_save_optim": no_save_optim,
                       "prefix": prefix, "load_path": load_path or "", "no_load_optim": no_load_optim},
        "optimizer": {"type": "AdamW", "betas": [training.adam_beta1, training.adam_beta2], "eps": training.adam_eps,
                      "weight_decay": training.weight_decay},
        "lr_scheduler": lr_scheduler,
        "train_dataset": {"dataloader": {
            "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
            "sizes": [steps * training.global_batch_size, 0, 0], "column_names": ["input_ids", "labels"],
            "shuffle": False,
            "config": {"seed": training.seed, "seq_length": model.seq_length, "split": "1, 0, 0",
                       "data_path": ["1", data_path], "eod": model.vocab_size - 1, "pad": -1},
        }},
        "model": {"model_type": model.family, "architectures": "TwinGPTForCausalLM", "model_config": model_config},
        **sections,
        "twin": {"data_sha256": data_sha256, "jit": jit},
    }


def twin_env(*, data_sha256: str | None, megatron_version: str, device: str | None = None) -> dict[str, str]:
    """The PyTorch twin's own settings, which are no Megatron flags: the data's sha256 it must verify, the
    megatron-core version whose formats it reproduces, and optionally its device (auto, cpu, cuda)."""
    env = {TWIN_MEGATRON_VERSION: megatron_version}
    if data_sha256:
        env[TWIN_DATA_SHA256] = data_sha256
    if device is not None:
        env[TWIN_DEVICE] = device
    return env
