"""Read the GPU side's effective settings from a Megatron-LM `pretrain_gpt.py` command line.

Flags are parsed with Megatron's own semantics (the last occurrence wins; an absent flag takes Megatron's
default, `megatron/training/arguments.py`): the twin's parser (`parse_megatron_args(strict=False)`) knows the
common flags and their defaults, and a small parser here adds the ones it does not implement (MLA, GatedDeltaNet,
DSA, zero-centred gamma, ...). Every value says whether a flag set it or a default did, because "Megatron used
its default" is the usual way the two sides drift apart (dropout 0.1, Adam beta2 0.999, GELU without `--swiglu`).

Derived settings follow Megatron's code, not its help text: the padded vocabulary and the end-of-document id
(NullTokenizer per megatron-core version, `alignflow.frameworks.megatron_versions`, then `vocab_size_with_padding`
rounds up to `--make-vocab-size-divisible-by` x TP unless `--padded-vocab-size` states it),
top-k renormalisation (`topk_routing_with_score_function`: softmax top-k is always renormalised unless
`--moe-router-pre-softmax`, sigmoid scores are when top-k > 1; docs/seeds.md#moe-router-renormalisation-norm_topk_prob),
the warm-up from `--lr-warmup-fraction` (a fraction of the decay steps).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from alignflow.errors import ConfigError
from alignflow.preflight.npu import Binder, split_fractions
from alignflow.preflight.values import MISSING, Value
from alignflow.twin.megatron_flags import eod_id, moe_layer_pattern, padded_vocab_size, parse_megatron_args
from alignflow.twin.render import TWIN_DATA_SHA256


def _extra_parser() -> argparse.ArgumentParser:
    """Flags real Megatron has and the twin's parser does not (defaults: None = "not given")."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--apply-layernorm-1p", "--attention-output-gate", "--multi-latent-attention",
                 "--moe-router-pre-softmax", "--squared-relu"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--experimental-attention-variant")
    p.add_argument("--padded-vocab-size", type=int)
    p.add_argument("--tokenizer-model")
    p.add_argument("--lr-warmup-fraction", type=float)
    for flag in ("--linear-attention-freq", "--linear-conv-kernel-dim", "--linear-key-head-dim",
                 "--linear-value-head-dim", "--linear-num-key-heads", "--linear-num-value-heads", "--q-lora-rank",
                 "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--dsa-indexer-n-heads",
                 "--dsa-indexer-head-dim", "--dsa-indexer-topk"):
        p.add_argument(flag, type=int)
    return p


class _Flags:
    """The parsed command line plus which flags were actually written (for the sources in the report)."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.ns = parse_megatron_args(argv, strict=False)
        extra, _ = _extra_parser().parse_known_args(self.ns.unknown_args)
        for name, value in vars(extra).items():
            setattr(self.ns, name, value)
        self.given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}

    def get(self, attr: str) -> Any:
        return getattr(self.ns, attr)

    def flag(self, attr: str) -> str:
        return "--" + attr.replace("_", "-")

    def value(self, attr: str, convert: Callable[[Any], Any] = lambda v: v) -> Value:
        flag = self.flag(attr)
        raw = self.get(attr)
        if flag in self.given:
            return Value(convert(raw), flag)
        if raw is None:
            return Value(MISSING, f"{flag} not given")
        return Value(convert(raw), f"{flag} not given: Megatron default")

    def switch(self, attr: str) -> Value:
        flag = self.flag(attr)
        return Value(bool(self.get(attr)), flag if flag in self.given else f"{flag} absent")


def gpu_settings(argv: Sequence[str], *, env: Mapping[str, str], env_source: str, bind: Binder,
                 megatron_version: str = "0.16") -> dict[str, Value]:
    """Every setting preflight compares, as `pretrain_gpt.py <argv>` of megatron-core `megatron_version` will run
    it (the twin mimics that version)."""
    try:
        f = _Flags(argv)
    except ConfigError as exc:
        raise ConfigError(f"preflight: the Megatron command line cannot be read: {exc}") from None
    ns = f.ns
    s: dict[str, Value] = {}
    steps = f.value("train_iters", int)
    micro = f.value("micro_batch_size", int)
    gbs = f.value("global_batch_size", int)
    if gbs.missing and not micro.missing:  # one data-parallel rank: the global batch is the micro batch
        gbs = Value(micro.value, "--global-batch-size not given: = --micro-batch-size (one data-parallel rank)")
    s |= {"train.steps": steps, "train.micro_batch_size": micro, "train.global_batch_size": gbs,
          "train.clip_grad": f.value("clip_grad", float), "train.init_seed": f.value("seed", int),
          "data.seed": f.value("seed", int), "data.seq_length": f.value("seq_length", int),
          "data.dataloader_type": f.value("dataloader_type"),
          "det.deterministic": f.switch("deterministic_mode"),
          "opt.type": f.value("optimizer", lambda v: "adamw" if v == "adam" else str(v)),
          "opt.weight_decay": f.value("weight_decay", float), "opt.eps": f.value("adam_eps", float),
          "opt.beta1": f.value("adam_beta1", float), "opt.beta2": f.value("adam_beta2", float),
          "opt.lr": f.value("lr", float), "opt.min_lr": f.value("min_lr", float),
          "opt.warmup_init": f.value("lr_warmup_init", float),
          "opt.decay_style": f.value("lr_decay_style")}
    decay = f.value("lr_decay_iters", int)
    s["opt.decay_steps"] = decay if not decay.missing else Value(steps.value, "--lr-decay-iters not given: "
                                                                 "= --train-iters")
    s["opt.warmup_steps"] = _warmup(f, s["opt.decay_steps"])
    weights_only = bool(ns.finetune) and bool(ns.no_load_optim)
    s["load.weights_only"] = Value(weights_only, "--finetune --no-load-optim" if weights_only else
                                   f"--finetune {'given' if ns.finetune else 'absent'}, --no-load-optim "
                                   f"{'given' if ns.no_load_optim else 'absent'}")
    s["data.split"] = _split(f)
    s["data.samples"] = (Value(int(steps.value) * int(gbs.value), "--train-iters x --global-batch-size")
                         if not (steps.missing or gbs.missing) else Value(MISSING, "--train-iters unknown"))
    s["data.file"] = _data_file(f, bind)
    if TWIN_DATA_SHA256 in env:
        sha = env[TWIN_DATA_SHA256]
        s["data.sha256"] = Value(sha or None, f"{TWIN_DATA_SHA256} ({env_source})" if sha else
                                 f"{TWIN_DATA_SHA256} empty: the runner fills in the data's sha256")
    s["data.eod"] = _eod(f, megatron_version)
    s |= _model(f, megatron_version)
    s |= _moe(f, s["model.num_layers"])
    nvte = env.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO")
    s["det.nvte"] = Value(nvte == "0", f"NVTE_ALLOW_NONDETERMINISTIC_ALGO={nvte} ({env_source})" if nvte is not None
                          else f"NVTE_ALLOW_NONDETERMINISTIC_ALGO unset ({env_source})")
    return s


def _warmup(f: _Flags, decay_steps: Value) -> Value:
    frac = f.get("lr_warmup_fraction")
    if frac is not None and not decay_steps.missing:  # Megatron: lr_warmup_steps = fraction * lr_decay_steps
        return Value(int(frac * int(decay_steps.value)), "--lr-warmup-fraction x decay steps")
    return f.value("lr_warmup_iters", int)


def _split(f: _Flags) -> Value:
    v = f.value("split")
    try:
        return Value(split_fractions(str(v.value)), v.source)
    except ValueError:
        return Value(MISSING, f"--split {v.value!r} is not a list of weights")


def _data_file(f: _Flags, bind: Binder) -> Value:
    paths = f.get("data_path")
    if not paths:
        return Value(MISSING, "--data-path not given")
    if len(paths) not in (1, 2):
        return Value(MISSING, f"--data-path {' '.join(paths)}: alignflow trains on one data file ([1] PREFIX)")
    return Value(bind(str(paths[-1]), "cuda"), "--data-path")


def _eod(f: _Flags, version: str) -> Value:
    if f.ns.tokenizer_type != "NullTokenizer":
        return Value(MISSING, f"--tokenizer-type {f.ns.tokenizer_type}: the EOD id comes from the tokenizer files")
    eod = eod_id(f.ns, version)
    given = "--null-tokenizer-eod-id" if f.ns.null_tokenizer_eod_id is not None else (
        f"--vocab-size {f.ns.vocab_size} (NullTokenizer of megatron-core {version})")
    return Value(eod, given)


def _model(f: _Flags, version: str = "0.16") -> dict[str, Value]:
    ns = f.ns
    hidden, heads = f.value("hidden_size", int), f.value("num_attention_heads", int)
    groups = (f.value("num_query_groups", int) if ns.group_query_attention else
              Value(heads.value, "--group-query-attention absent: = --num-attention-heads"))
    kv = f.value("kv_channels", int)
    if kv.missing and not (hidden.missing or heads.missing):
        kv = Value(int(hidden.value) // int(heads.value), "--kv-channels not given: hidden / heads")
    if ns.swiglu:
        act, glu = Value("silu", "--swiglu"), Value(True, "--swiglu")
    elif ns.squared_relu:
        act, glu = Value("squared_relu", "--squared-relu"), Value(False, "--swiglu absent")
    else:
        act, glu = Value("gelu", "--swiglu absent: Megatron default gelu"), Value(False, "--swiglu absent")
    variant = ns.experimental_attention_variant
    gdn = variant == "gated_delta_net"
    s = {
        "model.num_layers": f.value("num_layers", int), "model.hidden_size": hidden,
        "model.ffn_hidden_size": f.value("ffn_hidden_size", int), "model.num_attention_heads": heads,
        "model.num_query_groups": groups, "model.head_dim": kv, "model.seq_length": f.value("seq_length", int),
        "model.vocab_size": _padded_vocab(f, version), "model.position_embedding": f.value("position_embedding_type"),
        "model.rotary_base": f.value("rotary_base", float), "model.rotary_percent": f.value("rotary_percent", float),
        "model.normalization": f.value("normalization"), "model.norm_epsilon": f.value("norm_epsilon", float),
        "model.zero_centered_gamma": f.switch("apply_layernorm_1p"), "model.activation": act,
        "model.gated_linear_unit": glu,
        "model.add_bias_linear": Value(not ns.disable_bias_linear, "--disable-bias-linear" if ns.disable_bias_linear
                                       else "--disable-bias-linear absent: biases on"),
        "model.qk_layernorm": f.switch("qk_layernorm"),
        "model.attention_output_gate": f.switch("attention_output_gate"),
        "model.untie_embeddings": f.switch("untie_embeddings_and_output_weights"),
        "model.hidden_dropout": f.value("hidden_dropout", float),
        "model.attention_dropout": f.value("attention_dropout", float),
        "model.precision_bf16": f.switch("bf16"),
        "mtp.num_layers": (f.value("mtp_num_layers", int) if ns.mtp_num_layers is not None
                           else Value(0, "--mtp-num-layers not given: no MTP")),
        "mtp.loss_scale": f.value("mtp_loss_scaling_factor", float),
        "gdn.freq": f.value("linear_attention_freq", int) if gdn else Value(0, "--experimental-attention-variant "
                                                                               "is not gated_delta_net"),
        "mla.enabled": f.switch("multi_latent_attention"),
        "mla.q_lora_rank": f.value("q_lora_rank", int) if ns.q_lora_rank is not None
        else Value(None, "--q-lora-rank not given: no q down-projection"),
        "dsa.enabled": Value(variant == "dsa", f"--experimental-attention-variant {variant}" if variant
                             else "--experimental-attention-variant not given"),
    }
    for name in ("conv_kernel_dim", "key_head_dim", "value_head_dim", "num_key_heads", "num_value_heads"):
        s[f"gdn.{name}"] = f.value(f"linear_{name}", int)
    for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
        s[f"mla.{name}"] = f.value(name, int)
    backend = str(getattr(ns, "attention_backend", None) or "auto").rsplit(".", 1)[-1].split(":")[0].strip("<>")
    s["attention.backend"] = (Value(backend, f"--attention-backend {backend}") if ns.transformer_impl ==
                              "transformer_engine" else Value("local", "--transformer-impl local: megatron-core's "
                                                              "own DotProductAttention"))
    s["dsa.topk"] = f.value("dsa_indexer_topk", int)
    s["dsa.n_heads"] = f.value("dsa_indexer_n_heads", int)
    s["dsa.head_dim"] = f.value("dsa_indexer_head_dim", int)
    return s


def _padded_vocab(f: _Flags, version: str) -> Value:
    ns = f.ns
    if ns.padded_vocab_size is not None:  # build_tokenizer pads only when this is unset
        return Value(int(ns.padded_vocab_size), "--padded-vocab-size")
    tokenizer = ns.tokenizer_type
    if tokenizer != "NullTokenizer":
        return Value(MISSING, f"--tokenizer-type {tokenizer}: the vocabulary comes from the tokenizer files, which "
                     "preflight cannot read; alignment data is pre-tokenized, use NullTokenizer with "
                     "--vocab-size (NPU vocab - 1)")
    divisor = int(ns.make_vocab_size_divisible_by) * int(ns.tensor_model_parallel_size)
    orig, padded = padded_vocab_size(ns, version)
    how = "+ 1 (NullTokenizer eod)" if orig != int(ns.vocab_size) else "(NullTokenizer, eod included)"
    return Value(padded, f"--vocab-size {ns.vocab_size} {how} padded to a multiple of {divisor} "
                 f"(--make-vocab-size-divisible-by{' x TP' if ns.tensor_model_parallel_size != 1 else ''}; "
                 f"megatron-core {version})")


def _moe(f: _Flags, layers: Value) -> dict[str, Value]:
    ns = f.ns
    if not ns.num_experts:
        return {"moe.num_experts": Value(0, "--num-experts not given: dense model"),
                "moe.layer_pattern": Value((), "dense model")}
    topk = int(ns.moe_router_topk)
    score = ns.moe_router_score_function
    if score == "softmax":
        renorm = Value(not ns.moe_router_pre_softmax, "--moe-router-pre-softmax: softmax before top-k, no "
                       "renormalisation" if ns.moe_router_pre_softmax else "Megatron renormalises softmax top-k "
                       "(no switch; docs/seeds.md#moe-router-renormalisation-norm_topk_prob)")
    else:
        renorm = Value(topk > 1, f"Megatron normalises sigmoid top-{topk} scores when top-k > 1")
    pattern = Value(MISSING, "--num-layers unknown")
    if not layers.missing:
        try:
            pattern = Value(tuple(moe_layer_pattern(ns.moe_layer_freq, int(layers.value))),
                            "--moe-layer-freq" if "--moe-layer-freq" in f.given else "--moe-layer-freq not given: "
                            "Megatron default 1 (every layer)")
        except ConfigError as exc:
            pattern = Value(MISSING, str(exc))
    scaling = f.value("moe_router_topk_scaling_factor", float)
    if scaling.missing:
        scaling = Value(1.0, "--moe-router-topk-scaling-factor not given: no scaling")
    shared = f.value("moe_shared_expert_intermediate_size", int)
    if shared.missing:
        shared = Value(0, "--moe-shared-expert-intermediate-size not given: no shared expert")
    return {
        "moe.num_experts": f.value("num_experts", int), "moe.topk": f.value("moe_router_topk", int),
        "moe.ffn_hidden_size": f.value("moe_ffn_hidden_size", int), "moe.shared_expert_size": shared,
        "moe.shared_expert_gate": f.switch("moe_shared_expert_gate"),
        "moe.score_function": f.value("moe_router_score_function"), "moe.renormalize": renorm,
        "moe.topk_scaling": scaling, "moe.load_balancing": f.value("moe_router_load_balancing_type"),
        "moe.aux_loss_coeff": f.value("moe_aux_loss_coeff", float),
        "moe.expert_bias": f.switch("moe_router_enable_expert_bias"),
        "moe.bias_update_rate": f.value("moe_router_bias_update_rate", float),
        "moe.layer_pattern": pattern,
    }
