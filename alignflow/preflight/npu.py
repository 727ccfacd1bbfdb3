"""Read the NPU side's effective settings from a rendered MindFormers PyNative YAML (or the twin's).

Key names are MindFormers' (`pynative/config/config.py` TrainConfig and its sections; MindFormers r2.10
"Configuration File Description"). The `model` section passes its structure keys through to the model class,
so a setting may be spelled the HF way (`num_hidden_layers`, `rms_norm_eps`, `n_routed_experts`, as MindFormers'
PyNative DeepSeek-V3 YAMLs do) or the megatron-core way (`num_layers`, `layernorm_epsilon`, `num_moe_experts`,
as the twin and the graph-mode `model.model_config` do): each setting lists every spelling, and a YAML that
writes two spellings with different values is reported rather than resolved by guessing.

Defaults: only the ones MindFormers documents (TrainConfig sections) or that a seed established
(`norm_topk_prob` is False unless set, docs/seeds.md#moe-router-renormalisation-norm_topk_prob). A model key without a
documented default must be
written in the template: its default belongs to the model class, which preflight cannot see — and a silently
different default (GELU, no renormalisation, a different epsilon) is exactly what preflight exists to catch.
The twin's defaults are its own schema's (`alignflow.twin.mindformers_yaml`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from alignflow.preflight.values import MISSING, DataFile, Value

NpuFlavour = Literal["mindformers", "twin"]
Binder = Callable[[str, str], DataFile]  # (path as written, role) -> what it is bound to

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "swiglu": "silu", "fusedswiglu": "silu", "gelu": "gelu",
                "gelu_new": "gelu", "fast_gelu": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu",
                "squared_relu": "squared_relu"}
_SCHEDULERS = {"ConstantWarmUpLR": "constant", "LinearWithWarmUpLR": "linear", "CosineWithWarmUpLR": "cosine"}
_TWIN = "twin schema default"
_MF = "MindFormers default"


@dataclass(frozen=True, slots=True)
class Key:
    """One setting: its spellings, and its default per flavour.

    A path starting with `@` is under the model section (`model`, or `model.model_config` where that exists);
    a leading `!` negates a boolean (`!@tie_word_embeddings` spells "untied").
    """

    name: str
    paths: tuple[str, ...]
    defaults: Mapping[str, Any] | None = None  # flavour -> default; a flavour left out must write the key
    convert: Callable[[Any], Any] = lambda v: v
    feature: bool = False  # absent = the feature is off (no experts, no MTP, ...), not "a default value"


def _both(value: Any) -> dict[str, Any]:
    return {"mindformers": value, "twin": value}


def _twin(value: Any) -> dict[str, Any]:
    return {"twin": value}


def _not(value: Any) -> bool:
    return not bool(value)


# Plain keys: one value, no derivation; every spelling is looked at (two that disagree are an error).
KEYS: tuple[Key, ...] = (
    Key("train.steps", ("training.steps",), _both(1000), int),
    Key("train.micro_batch_size", ("training.local_batch_size",), _both(1), int),
    Key("train.global_batch_size", ("training.global_batch_size",), _both(1), int),
    Key("train.clip_grad", ("training.max_norm",), _both(1.0), float),
    Key("train.init_seed", ("training.seed",), _both(42), int),
    Key("det.deterministic", ("training.deterministic",), _both(False), bool),
    Key("data.seed", ("train_dataset.dataloader.config.seed",), _twin(1234), int),
    Key("data.seq_length", ("train_dataset.dataloader.config.seq_length",), None, int),
    Key("data.shuffle", ("train_dataset.dataloader.shuffle",), _both(False), bool),
    Key("data.eod", ("train_dataset.dataloader.config.eod",), None, int),
    Key("opt.type", ("optimizer.type",), _both("AdamW"), lambda v: str(v).lower()),
    Key("opt.weight_decay", ("optimizer.weight_decay",), _both(0.01), float),
    Key("opt.eps", ("optimizer.eps",), _both(1e-8), float),
    Key("opt.lr", ("lr_scheduler.learning_rate",), _both(1e-5), float),
    Key("opt.warmup_init", ("lr_scheduler.warmup_lr_init",), _both(0.0), float),
    Key("load.weights_only", ("checkpoint.no_load_optim",), _both(False), bool),
    Key("model.num_layers", ("@num_hidden_layers", "@num_layers"), None, int),
    Key("model.hidden_size", ("@hidden_size",), None, int),
    Key("model.ffn_hidden_size", ("@intermediate_size", "@ffn_hidden_size"), None, int),
    Key("model.num_attention_heads", ("@num_attention_heads",), None, int),
    Key("model.seq_length", ("@seq_length",), None, int),
    Key("model.vocab_size", ("@vocab_size",), None, int),
    Key("model.position_embedding", ("@position_embedding_type",), _twin("rope"), str),
    Key("model.rotary_base", ("@rope_theta", "@rotary_base"), _twin(10000.0), float),
    Key("model.rotary_percent", ("@partial_rotary_factor", "@rotary_percent"), _twin(1.0), float),
    Key("model.normalization", ("@normalization",), _twin("RMSNorm"), str),
    Key("model.norm_epsilon", ("@rms_norm_eps", "@layernorm_epsilon"), _twin(1e-5), float),
    Key("model.zero_centered_gamma", ("@layernorm_zero_centered_gamma", "@apply_layernorm_1p"),
        _both(False), bool),
    Key("model.gated_linear_unit", ("@gated_linear_unit",), _twin(True), bool),
    Key("model.add_bias_linear", ("@add_bias_linear",), _twin(False), bool),
    Key("model.qk_layernorm", ("@qk_layernorm",), _twin(False), bool),
    Key("model.attention_output_gate", ("@attn_output_gate", "@attention_output_gate"), _both(False), bool),
    Key("model.untie_embeddings", ("@untie_embeddings_and_output_weights", "!@tie_word_embeddings"),
        _twin(True), bool),
    Key("model.hidden_dropout", ("@hidden_dropout",), _twin(0.0), float),
    Key("model.attention_dropout", ("@attention_dropout",), _twin(0.0), float),
    Key("mtp.num_layers", ("@mtp_num_layers", "@num_nextn_predict_layers", "@mtp_num_hidden_layers"), _both(0),
        lambda v: int(v or 0), feature=True),
    Key("gdn.freq", ("@full_attention_interval", "@linear_attention_freq"), _both(0), int, feature=True),
    Key("gdn.conv_kernel_dim", ("@linear_conv_kernel_dim",), None, int),
    Key("gdn.key_head_dim", ("@linear_key_head_dim",), None, int),
    Key("gdn.value_head_dim", ("@linear_value_head_dim",), None, int),
    Key("gdn.num_key_heads", ("@linear_num_key_heads",), None, int),
    Key("gdn.num_value_heads", ("@linear_num_value_heads",), None, int),
    Key("mla.q_lora_rank", ("@q_lora_rank",), _both(None), lambda v: None if v is None else int(v)),
    Key("mla.kv_lora_rank", ("@kv_lora_rank",), _both(0), int, feature=True),
    Key("mla.qk_head_dim", ("@qk_nope_head_dim", "@qk_head_dim"), None, int),
    Key("mla.qk_pos_emb_head_dim", ("@qk_rope_head_dim", "@qk_pos_emb_head_dim"), None, int),
    Key("mla.v_head_dim", ("@v_head_dim",), None, int),
    Key("dsa.topk", ("@index_topk", "@dsa_indexer_topk"), _both(0), int, feature=True),
    Key("dsa.n_heads", ("@index_n_heads", "@dsa_indexer_n_heads"), None, int),
    Key("dsa.head_dim", ("@index_head_dim", "@dsa_indexer_head_dim"), None, int),
    Key("moe.num_experts", ("@n_routed_experts", "@num_experts", "@num_moe_experts"), _both(0),
        lambda v: int(v or 0), feature=True),
    Key("moe.topk", ("@num_experts_per_tok", "@moe_router_topk"), _twin(2), int),
    Key("moe.ffn_hidden_size", ("@moe_intermediate_size", "@moe_ffn_hidden_size"), None, int),
    Key("moe.shared_expert_gate", ("@moe_shared_expert_gate", "@shared_expert_gate"), _twin(False), bool),
    Key("moe.score_function", ("@scoring_func", "@moe_router_score_function"), _twin("softmax"), str),
    # docs/seeds.md#moe-router-renormalisation-norm_topk_prob: MindSpore does not renormalise unless norm_topk_prob is
    # set; Megatron always does
    Key("moe.renormalize", ("@norm_topk_prob",), {"mindformers": False, "twin": True}, bool),
    Key("moe.topk_scaling", ("@routed_scaling_factor", "@moe_router_topk_scaling_factor"), _twin(None),
        lambda v: 1.0 if v is None else float(v)),
    Key("moe.load_balancing", ("@moe_router_load_balancing_type",), _twin("aux_loss"), str),
    Key("moe.aux_loss_coeff", ("@moe_aux_loss_coeff", "@router_aux_loss_coef"), _twin(0.0), float),
    Key("moe.expert_bias", ("@moe_router_enable_expert_bias",), _both(False), bool),
    Key("moe.bias_update_rate", ("@moe_router_bias_update_rate",), _twin(1e-3), float),
    Key("mtp.loss_scale", ("@mtp_loss_scaling_factor",), _twin(0.1), float),
)


def npu_settings(config: Mapping[str, Any], flavour: NpuFlavour, *, env: Mapping[str, str],
                 env_source: str, bind: Binder) -> dict[str, Value]:
    """Every setting preflight compares, as the NPU side will see it."""
    model_node = "model.model_config" if isinstance(_get(config, "model.model_config")[1], dict) else "model"
    r = _Reader(config, flavour, model_node)
    s: dict[str, Value] = {k.name: r.key(k) for k in KEYS}
    steps = s["train.steps"]

    # derived settings: several keys, or a value computed the way MindFormers computes it
    s["opt.beta1"], s["opt.beta2"] = _betas(r)
    s["opt.decay_style"] = _decay_style(r)
    s["opt.warmup_steps"] = _warmup(r, steps)
    s["opt.decay_steps"] = _decay_steps(r, steps)
    s["opt.min_lr"] = r.first(("lr_scheduler.lr_end", "lr_scheduler.min_lr"), float, _both(0.0))
    s["model.num_query_groups"] = r.first(("@num_key_value_heads", "@num_query_groups"), int,
                                          None, fallback=s["model.num_attention_heads"])
    s["model.head_dim"] = _head_dim(r, s)
    s["model.activation"] = _activation(r)
    if s["model.activation"].value == "silu" and r.raw("@hidden_act")[1] in ("swiglu", "fusedswiglu") \
            and s["model.gated_linear_unit"].missing:
        s["model.gated_linear_unit"] = Value(True, f"{r.where('@hidden_act')} {r.raw('@hidden_act')[1]} is GLU")
    s["model.precision_bf16"] = _precision(r, flavour)
    s["moe.shared_expert_size"] = _shared_size(r)
    s["moe.layer_pattern"] = _moe_pattern(r, s)
    s["mla.enabled"] = _flag_or(r, "@multi_latent_attention", s["mla.kv_lora_rank"], "kv_lora_rank")
    s["dsa.enabled"] = Value(bool(s["dsa.topk"].value), s["dsa.topk"].source) \
        if not s["dsa.topk"].missing else s["dsa.topk"]
    s["data.split"] = _split(r)
    s["data.samples"] = _samples(r)
    s["data.file"] = _data_file(r, bind)
    if flavour == "twin":
        sha = r.raw("twin.data_sha256")[1]
        s["data.sha256"] = Value(sha or None, "twin.data_sha256" if sha else
                                 "twin.data_sha256 empty: the runner fills in the data file's sha256")
    hccl = env.get("HCCL_DETERMINISTIC")
    s["det.hccl"] = Value(str(hccl).lower() == "true" if hccl is not None else False,
                          f"HCCL_DETERMINISTIC={hccl} ({env_source})" if hccl is not None
                          else f"HCCL_DETERMINISTIC unset ({env_source})")
    return s


def _get(config: Any, dotted: str) -> tuple[bool, Any]:
    node = config
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


class _Reader:
    """Looks keys up in one rendered config, remembering the flavour's defaults and the model section's path."""

    def __init__(self, config: Mapping[str, Any], flavour: str, model_node: str) -> None:
        self.config, self.flavour, self.model_node = config, flavour, model_node

    def where(self, path: str) -> str:
        return path.replace("@", f"{self.model_node}.").lstrip("!")

    def raw(self, path: str) -> tuple[bool, Any]:
        found, value = _get(self.config, self.where(path))
        if found and path.startswith("!"):
            value = _not(value)
        return found, value

    def first(self, paths: tuple[str, ...], convert: Callable[[Any], Any], defaults: Mapping[str, Any] | None,
              *, fallback: Value | None = None) -> Value:
        present = [(p, v) for p in paths for found, v in [self.raw(p)] if found]
        if present:
            values = {repr(_safe(convert, v)) for _, v in present}
            if len(values) > 1:
                written = ", ".join(f"{self.where(p)}={v!r}" for p, v in present)
                return Value(MISSING, f"conflicting spellings {written}; keep one")
            path, value = present[0]
            try:
                return Value(convert(value), self.where(path) + (" (negated)" if path.startswith("!") else ""))
            except (TypeError, ValueError):
                return Value(MISSING, f"{self.where(path)}: {value!r} is not a valid value")
        if defaults is not None and self.flavour in defaults:
            label = _TWIN if self.flavour == "twin" else _MF
            return Value(defaults[self.flavour], f"{' / '.join(self.where(p) for p in paths)} unset: {label}")
        if fallback is not None and not fallback.missing:
            return Value(fallback.value, f"{' / '.join(self.where(p) for p in paths)} unset: = {fallback.source}")
        return Value(MISSING, f"{' / '.join(self.where(p) for p in paths)} unset; no documented default — write it "
                     "in the template")

    def key(self, key: Key) -> Value:
        value = self.first(key.paths, key.convert, key.defaults)
        if key.feature and value.source.endswith((_MF, _TWIN)):
            return Value(value.value, value.source.rsplit(":", 1)[0] + ": none")
        return value


def _safe(convert: Callable[[Any], Any], value: Any) -> Any:
    try:
        return convert(value)
    except (TypeError, ValueError):
        return value


def _betas(r: _Reader) -> tuple[Value, Value]:
    found, betas = r.raw("optimizer.betas")
    if not found:
        label = _TWIN if r.flavour == "twin" else _MF
        return Value(0.9, f"optimizer.betas unset: {label}"), Value(0.95, f"optimizer.betas unset: {label}")
    if not isinstance(betas, list | tuple) or len(betas) != 2:
        bad = Value(MISSING, f"optimizer.betas: {betas!r} is not [beta1, beta2]")
        return bad, bad
    return Value(float(betas[0]), "optimizer.betas[0]"), Value(float(betas[1]), "optimizer.betas[1]")


def _decay_style(r: _Reader) -> Value:
    found, kind = r.raw("lr_scheduler.type")
    if not found or kind is None:
        return Value(MISSING, "lr_scheduler.type unset")
    style = _SCHEDULERS.get(str(kind))
    return Value(style, f"lr_scheduler.type {kind}") if style else Value(
        f"{kind} (no Megatron equivalent known)", "lr_scheduler.type")


def _warmup(r: _Reader, steps: Value) -> Value:
    found_ratio, ratio = r.raw("lr_scheduler.warmup_ratio")
    if found_ratio and ratio is not None and not steps.missing:
        # MindFormers' warm-up schedulers: warmup_steps = int(warmup_ratio * total_steps)
        return Value(int(float(ratio) * int(steps.value)),
                     f"lr_scheduler.warmup_ratio {ratio} x training.steps {steps.value}")
    return r.first(("lr_scheduler.warmup_steps",), lambda v: int(v or 0), _both(0))


def _decay_steps(r: _Reader, steps: Value) -> Value:
    return r.first(("lr_scheduler.decay_steps",), int, None, fallback=steps)


def _head_dim(r: _Reader, s: Mapping[str, Value]) -> Value:
    value = r.first(("@head_dim", "@kv_channels"), int, None)
    if not value.missing:
        return value
    hidden, heads = s["model.hidden_size"], s["model.num_attention_heads"]
    if hidden.missing or heads.missing or not heads.value:
        return value
    return Value(int(hidden.value) // int(heads.value), f"{r.where('@head_dim')} unset: hidden_size / "
                 "num_attention_heads")


def _activation(r: _Reader) -> Value:
    found, act = r.raw("@hidden_act")
    if not found:
        if r.flavour == "twin":
            return Value("silu", f"{r.where('@hidden_act')} unset: {_TWIN}")
        return Value(MISSING, f"{r.where('@hidden_act')} unset; no documented default — write it in the template")
    name = _ACTIVATIONS.get(str(act).lower())
    return Value(name or str(act), r.where("@hidden_act") + (f" {act}" if name and name != act else ""))


def _precision(r: _Reader, flavour: str) -> Value:
    key = "@params_dtype" if flavour == "twin" else "@compute_dtype"
    found, dtype = r.raw(key)
    if not found:
        return Value(MISSING, f"{r.where(key)} unset")
    return Value(str(dtype).lower() in ("bfloat16", "bf16"), f"{r.where(key)} {dtype}")


def _shared_size(r: _Reader) -> Value:
    """Total FFN size of the shared experts (Megatron's `--moe-shared-expert-intermediate-size`); DeepSeek-style
    configs may state it as `n_shared_experts` x `moe_intermediate_size` instead."""
    paths = ("@moe_shared_expert_intermediate_size", "@shared_expert_intermediate_size")
    if any(r.raw(p)[0] for p in paths):
        return r.first(paths, lambda v: int(v or 0), None)
    found_n, n = r.raw("@n_shared_experts")
    found_i, size = r.raw("@moe_intermediate_size")
    if found_n and found_i and n:
        return Value(int(n) * int(size), f"{r.where('@n_shared_experts')} x {r.where('@moe_intermediate_size')}")
    return r.first(paths, lambda v: int(v or 0), _both(0))


def _moe_pattern(r: _Reader, s: Mapping[str, Value]) -> Value:
    """Per decoder layer, 1 = MoE: `moe_layer_freq` (N or a 0/1 list), `first_k_dense_replace` (k dense, then MoE)."""
    layers = s["model.num_layers"]
    if s["moe.num_experts"].value in (0, MISSING) or layers.missing:
        return Value((), "dense model")
    n = int(layers.value)
    found, freq = r.raw("@moe_layer_freq")
    if found:
        if isinstance(freq, list):
            return Value(tuple(int(x) for x in freq), r.where("@moe_layer_freq"))
        return Value(tuple(1 if i % int(freq) == 0 else 0 for i in range(n)), f"{r.where('@moe_layer_freq')} {freq}")
    found, k = r.raw("@first_k_dense_replace")
    if found:
        return Value(tuple([0] * int(k) + [1] * (n - int(k))), f"{r.where('@first_k_dense_replace')} {k}")
    if r.flavour == "twin":
        return Value(tuple([1] * n), f"{r.where('@moe_layer_freq')} unset: {_TWIN} (every layer)")
    return Value(MISSING, f"{r.where('@moe_layer_freq')} / {r.where('@first_k_dense_replace')} unset; write which "
                 "layers are MoE in the template")


def _flag_or(r: _Reader, path: str, implied_by: Value, what: str) -> Value:
    found, flag = r.raw(path)
    if found:
        return Value(bool(flag), r.where(path))
    on = not implied_by.missing and bool(implied_by.value)
    return Value(on, f"{r.where(path)} unset: {'implied by ' + what if on else 'off'}")


def _split(r: _Reader) -> Value:
    found, split = r.raw("train_dataset.dataloader.config.split")
    if not found:
        return Value(MISSING, "train_dataset.dataloader.config.split unset")
    try:
        return Value(split_fractions(str(split)), "train_dataset.dataloader.config.split")
    except ValueError:
        return Value(MISSING, f"train_dataset.dataloader.config.split: {split!r} is not a list of weights")


def split_fractions(split: str) -> tuple[float, ...]:
    """`'1, 0, 0'` and `'100,0,0'` are the same split: normalised weights, padded to three."""
    parts = [float(x) for x in split.replace("/", ",").split(",") if x.strip()]
    total = sum(parts)
    if not parts or total <= 0:
        raise ValueError(split)
    return tuple(round(x / total, 12) for x in (parts + [0.0] * 3)[:3])


def _samples(r: _Reader) -> Value:
    found, sizes = r.raw("train_dataset.dataloader.sizes")
    if not found or not isinstance(sizes, list) or not sizes:
        return Value(MISSING, "train_dataset.dataloader.sizes unset")
    return Value(int(sizes[0]), "train_dataset.dataloader.sizes[0]")


def _data_file(r: _Reader, bind: Binder) -> Value:
    key = "train_dataset.dataloader.config.data_path"
    found, path = r.raw(key)
    if not found:
        return Value(MISSING, f"{key} unset")
    if isinstance(path, list):
        if len(path) not in (1, 2):
            return Value(MISSING, f"{key}: {path!r}: alignflow trains on one data file (['1', PREFIX])")
        path = path[-1]
    return Value(bind(str(path), "ascend"), key)
