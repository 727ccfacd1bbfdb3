"""Render one experiment's model and training sections into the twin's two command lines.

`mindformers_config(...)` returns the MindFormers PyNative YAML (as a dict) for
`python -m alignflow.reference.mindspore_train --config X.yaml --mode 1`; `megatron_args(...)` returns the
`pretrain_gpt.py` flags for `python -m alignflow.reference.torch_train`. Both use the real frameworks' key and
flag names, so the real-backend renderers can reuse them (`twin=False` leaves the twin extensions out).

Two framework traps are handled here rather than left to chance: Megatron's `NullTokenizer` adds one id to
`--vocab-size` before padding, so the flag is `vocab_size - 1` and the padded size must come out equal to the
NPU side's vocabulary (megatron §7.8); and both sides get the same data seed, split and sample count so that
their `GPTDataset` orders agree (seed 001 §10.1).
"""

from __future__ import annotations

from typing import Any

from alignflow.config.model import ModelConfig, TrainingConfig
from alignflow.errors import ConfigError
from alignflow.reference.flavours import Flavour

_SCHEDULERS = {"constant": "ConstantWarmUpLR", "linear": "LinearWithWarmUpLR", "cosine": "CosineWithWarmUpLR"}


def _num(value: float) -> str:
    """A float flag value that round-trips (`1e-05`, `0.001`), integral values without a fraction."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


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
        "untie_embeddings_and_output_weights": model.untie_embeddings_and_output_weights,
        "hidden_dropout": model.hidden_dropout, "attention_dropout": model.attention_dropout,
        "init_method_std": model.init_method_std, "params_dtype": "bfloat16" if training.bf16 else "float32",
        "compute_dtype": "float32", "use_interleaved_weight_layout_mlp": True,
    }
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
        "twin": {"data_sha256": data_sha256, "jit": jit},
    }


def megatron_vocab_flags(model: ModelConfig) -> list[str]:
    """`--vocab-size V-1 --make-vocab-size-divisible-by D`, refusing a D that would pad the embedding."""
    d = model.make_vocab_size_divisible_by
    padded = -(-model.vocab_size // d) * d  # NullTokenizer: (V - 1) + 1 ids before padding
    if padded != model.vocab_size:
        raise ConfigError(f"model.vocab_size {model.vocab_size} is not a multiple of make_vocab_size_divisible_by "
                          f"{d}: Megatron would pad the embedding to {padded} rows, and padded rows change the loss")
    return ["--vocab-size", str(model.vocab_size - 1), "--make-vocab-size-divisible-by", str(d)]


def megatron_args(
    model: ModelConfig,
    training: TrainingConfig,
    *,
    data_path: str,
    data_sha256: str | None,
    load: str | None,
    save: str | None,
    steps: int,
    transformer_impl: Flavour = "local",
    megatron_version: str = "0.16",
    save_interval: int | None = None,
    finetune: bool = True,
    twin: bool = True,
    device: str = "auto",
) -> list[str]:
    """`pretrain_gpt.py` flags for the model and training (the twin's extensions unless `twin=False`)."""
    a: list[str] = ["--transformer-impl", transformer_impl, "--num-layers", str(model.num_layers),
                    "--hidden-size", str(model.hidden_size), "--ffn-hidden-size", str(model.ffn_hidden_size),
                    "--num-attention-heads", str(model.num_attention_heads)]
    if model.num_query_groups is not None:
        a += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    a += ["--kv-channels", str(model.head_dim), "--seq-length", str(model.seq_length),
          "--max-position-embeddings", str(model.max_position_embeddings or model.seq_length),
          "--position-embedding-type", model.position_embedding_type, "--rotary-base", _num(model.rotary_base),
          "--normalization", model.normalization, "--norm-epsilon", _num(model.norm_epsilon),
          "--init-method-std", _num(model.init_method_std)]
    if model.gated_linear_unit and model.activation == "silu":
        a.append("--swiglu")
    if not model.add_bias_linear:
        a.append("--disable-bias-linear")
    if model.untie_embeddings_and_output_weights:
        a.append("--untie-embeddings-and-output-weights")
    a += megatron_vocab_flags(model)
    a += ["--attention-dropout", _num(model.attention_dropout), "--hidden-dropout", _num(model.hidden_dropout)]
    moe = model.moe
    if moe is not None:
        a += ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.router_topk),
              "--moe-ffn-hidden-size", str(moe.ffn_hidden_size),
              "--moe-layer-freq", "[" + ",".join(str(x) for x in moe.layer_freq) + "]" if moe.layer_freq else "1",
              "--moe-router-load-balancing-type", moe.load_balancing_type,
              "--moe-aux-loss-coeff", _num(moe.aux_loss_coeff),
              "--moe-router-score-function", moe.router_score_function, "--moe-token-dispatcher-type", "alltoall"]
        if moe.shared_expert_intermediate_size is not None:
            a += ["--moe-shared-expert-intermediate-size", str(moe.shared_expert_intermediate_size)]
        if moe.shared_expert_gate:
            a.append("--moe-shared-expert-gate")
        if moe.router_enable_expert_bias:
            a += ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
                  _num(moe.router_bias_update_rate)]
        if moe.router_topk_scaling_factor is not None:
            a += ["--moe-router-topk-scaling-factor", _num(moe.router_topk_scaling_factor)]
        if moe.router_dtype is not None:
            a += ["--moe-router-dtype", moe.router_dtype]
        if transformer_impl == "transformer_engine":
            a.append("--moe-grouped-gemm")
    if model.mtp is not None:
        a += ["--mtp-num-layers", str(model.mtp.num_layers),
              "--mtp-loss-scaling-factor", _num(model.mtp.loss_scaling_factor)]
    a += ["--seed", str(training.seed), "--train-iters", str(steps), "--lr", _num(training.lr),
          "--min-lr", _num(training.min_lr), "--lr-warmup-iters", str(training.lr_warmup_iters),
          "--lr-decay-style", training.lr_decay_style]
    if training.lr_decay_iters is not None:
        a += ["--lr-decay-iters", str(training.lr_decay_iters)]
    a += ["--clip-grad", _num(training.clip_grad), "--weight-decay", _num(training.weight_decay),
          "--adam-beta1", _num(training.adam_beta1), "--adam-beta2", _num(training.adam_beta2),
          "--adam-eps", _num(training.adam_eps), "--micro-batch-size", str(training.micro_batch_size),
          "--global-batch-size", str(training.global_batch_size), "--log-interval", "1", "--eval-iters", "0",
          "--data-path", data_path, "--split", "100,0,0", "--dataloader-type", "single",
          "--tokenizer-type", "NullTokenizer", "--ckpt-format", "torch"]
    if training.bf16:
        a.append("--bf16")
    if training.deterministic:
        a.append("--deterministic-mode")
    if load is not None:
        a += ["--load", load, "--no-load-optim", "--no-load-rng"] + (["--finetune"] if finetune else [])
    if save is not None:
        a += ["--save", save, "--save-interval", str(save_interval or steps)]
    if twin:
        if data_sha256 is not None:
            a += ["--twin-data-sha256", data_sha256]
        a += ["--twin-megatron-version", megatron_version]
        if device != "auto":
            a += ["--twin-device", device]
    return a
