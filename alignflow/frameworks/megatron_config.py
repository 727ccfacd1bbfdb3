"""From a `pretrain_gpt.py` command line to the keyword arguments of megatron-core's `TransformerConfig`.

Megatron-LM builds its model config in `megatron/training` (`parse_args`, `validate_args`, then
`core_transformer_config_from_args`), which is not on PyPI. This module says, in alignflow's own words, what those
three do to the fields of a GPT model's config, so that the real `TransformerConfig` / `MLATransformerConfig` of
each megatron-core release can be built from a rendered command line on a machine without Megatron-LM
(`alignflow.frameworks.megatron_build`), every `__post_init__` check included:

1. **Parse.** Every argument starts at its default and each flag stores what Megatron's parser stores (`--x`
   True, `--no-rope-fusion` False, a value converted to its type); both come from the flag table of the version
   (`megatron_flags/core_vX.Y.json`, generated from the release's `arguments.py`).
2. **Settle** (`validate_args`): the parameter dtype follows `--bf16` / `--fp16`; no linear bias turns the bias-GELU
   fusion off, a linear bias turns the q/k/v bias on; a position embedding other than RoPE turns RoPE fusion off;
   `--num-experts 0` means none and the experts' FFN defaults to `--ffn-hidden-size`; the FFN defaults to 4 x hidden
   (8/3 x hidden rounded down to a multiple of 64 with `--swiglu`) and the head dimension to hidden / heads; one
   load-balancing type or aux-loss coefficient given as a list is that value; without an interleaved pipeline
   schedule there is no point-to-point overlap; weights are in one shard unless `--*-num-weight-shards` says (0.19).
3. **Map** (`core_transformer_config_from_args`): `--multi-latent-attention` picks `MLATransformerConfig`; every
   config field named like an argument takes its value; then the fields whose argument has another name or meaning:
   `persist_layer_norm` is the negation of `--no-persist-layer-norm`, `num_moe_experts` is `--num-experts`,
   `pipeline_dtype` the parameter dtype, `batch_p2p_comm` the negation of `--overlap-p2p-comm`, `--swiglu` means SiLU
   with a gated linear unit and the bias-SwiGLU fusion switch (else the bias-GELU one), `--squared-relu` and
   `--quick-geglu` their activations, `num_query_groups` only with `--group-query-attention`, `rope_type` only when
   given (each config class has its own default: MLA's is YaRN), the first and last pipeline stages' layer counts,
   `fp8_param` / `fp4_param` from their `*-gather` flags, `inference_sampling_seed` the `--seed`.

`benchmarks/megatron_real_checks.py` checks this against the real `core_transformer_config_from_args` of each
release's Megatron-LM checkout, field by field, for every shipped experiment.

Values that are torch objects (dtypes, activation functions) are `Symbol`s here; the side that imports torch
resolves them (`Symbol.resolve`).
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from alignflow.errors import ConfigError
from alignflow.frameworks.megatron_lm import load_table


@dataclass(frozen=True, slots=True)
class Symbol:
    """A torch object named by its dotted path (`torch.bfloat16`, `torch.nn.functional.silu`)."""

    path: str

    def resolve(self) -> Any:
        import importlib

        module, _, name = self.path.rpartition(".")
        return getattr(importlib.import_module(module), name)


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _Refused(message)


_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str}


def parse_args(argv: Sequence[str], version: str, *, strict: bool = True) -> dict[str, Any]:
    """Megatron-LM `version`'s parsed arguments of `pretrain_gpt.py <argv>`, before `validate_args` (step 1).

    Raises ConfigError for a command line its parser refuses (`strict=False`: unknown flags are skipped, for a
    caller that reports them itself) or a version without a table. An argument whose default is not plain data (an
    enum) is left out: no config field it feeds is checked here."""
    table = load_table(version)
    if table is None:
        raise ConfigError(f"megatron-core {version}: no flag table")
    parser = _Parser(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False, argument_default=argparse.SUPPRESS)
    for row in table["arguments"]:
        if row["nargs"] == 0:
            for flag, value in row["sets"].items():
                parser.add_argument(flag, dest=row["dest"], action="store_const", const=value)
            continue
        kwargs: dict[str, Any] = {"dest": row["dest"], "type": _TYPES.get(row["type"], str)}
        if row["nargs"] is not None:
            kwargs["nargs"] = row["nargs"]
        parser.add_argument(*row["flags"], **kwargs)
    try:
        ns, unknown = parser.parse_known_args(list(argv))
        if strict and unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        given = vars(ns)
    except _Refused as exc:
        raise ConfigError(f"the parser of {table['source']}: {exc}") from None
    args = {row["dest"]: row["default"] for row in table["arguments"]
            if not (isinstance(row["default"], dict) and "repr" in row["default"])}
    return args | given


# Arguments whose converter reads "an int, or a list of 0/1 per layer written as a Python expression" (Megatron's
# `moe_freq_type`): `4`, `[0,1,1,1]`, `([1]*3+[0])*2`.
_LAYER_FREQ = ("moe_layer_freq", "linear_attention_freq", "no_rope_freq", "window_attn_skip_freq")


def layer_freq(text: Any) -> Any:
    """`--moe-layer-freq`'s value as Megatron reads it: an int, or the list the expression makes (a list literal
    combined with `+` and `*` only; anything else is returned unchanged, for the config to refuse)."""
    if not isinstance(text, str):
        return text
    if "[" not in text:
        return int(text) if text.strip().lstrip("-").isdigit() else text

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(ast.dump(node))

    try:
        return value(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, TypeError):
        return text


def settle(args: dict[str, Any]) -> dict[str, Any]:
    """What `validate_args` changes in `args` that reaches the model config (step 2), and the converters of the
    arguments the flag table records as text."""
    a = dict(args)
    for name in _LAYER_FREQ:
        if name in a:
            a[name] = layer_freq(a[name])
    a["params_dtype"] = Symbol("torch.bfloat16" if a.get("bf16") else "torch.half" if a.get("fp16") else "torch.float")
    if not a.get("add_bias_linear", True):
        a["bias_gelu_fusion"] = False
    if a.get("add_bias_linear", True):
        a["add_qkv_bias"] = True
    if a.get("position_embedding_type") != "rope":
        a["apply_rope_fusion"] = False
    if a.get("num_experts") == 0:
        a["num_experts"] = None
    if a.get("num_experts") is not None and a.get("moe_ffn_hidden_size") is None:
        a["moe_ffn_hidden_size"] = a.get("ffn_hidden_size")
    if a.get("ffn_hidden_size") is None and a.get("hidden_size") is not None:
        hidden = int(a["hidden_size"])
        a["ffn_hidden_size"] = int((4 * hidden * 2 / 3) / 64) * 64 if a.get("swiglu") else 4 * hidden
    if a.get("kv_channels") is None and a.get("hidden_size") and a.get("num_attention_heads"):
        a["kv_channels"] = int(a["hidden_size"]) // int(a["num_attention_heads"])
    for name in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):
        if isinstance(a.get(name), list) and len(a[name]) == 1:
            a[name] = a[name][0]
    if a.get("virtual_pipeline_model_parallel_size") is None:  # no interleaved schedule: nothing to overlap
        a["overlap_p2p_comm"] = False
        a["align_param_gather"] = False
    for name in ("tensor_parallel_num_weight_shards", "expert_tensor_parallel_num_weight_shards"):
        if name in a and a[name] is None:  # 0.19+: unsharded weights unless asked
            a[name] = 1
    return a


def config_class(args: dict[str, Any]) -> str:
    """`MLATransformerConfig` with `--multi-latent-attention`, else `TransformerConfig`."""
    return "MLATransformerConfig" if args.get("multi_latent_attention") else "TransformerConfig"


# Config fields whose argument has another name or meaning (step 3), each a function of the settled arguments.
_RENAMED: dict[str, Any] = {
    "persist_layer_norm": lambda a: not a.get("no_persist_layer_norm", False),
    "deallocate_pipeline_outputs": lambda a: True,
    "pipeline_dtype": lambda a: a["params_dtype"],
    "batch_p2p_comm": lambda a: not a.get("overlap_p2p_comm", False),
    "num_moe_experts": lambda a: a.get("num_experts"),
    "num_layers_in_first_pipeline_stage": lambda a: a.get("decoder_first_pipeline_num_layers"),
    "num_layers_in_last_pipeline_stage": lambda a: a.get("decoder_last_pipeline_num_layers"),
    "fp8_param": lambda a: a.get("fp8_param_gather", False),
    "fp4_param": lambda a: a.get("fp4_param_gather", False),
    "inference_sampling_seed": lambda a: a.get("seed"),
    "num_query_groups": lambda a: a.get("num_query_groups") if a.get("group_query_attention") else None,
}


def config_kwargs(args: dict[str, Any], fields: Collection[str]) -> dict[str, Any]:
    """The keyword arguments Megatron-LM passes to the config class whose dataclass fields are `fields` (step 3;
    `args` as `settle` returns them)."""
    kw = {name: args[name] for name in fields if name in args}
    for name, derive in _RENAMED.items():
        if name in fields:
            kw[name] = derive(args)
    if args.get("swiglu"):
        kw |= {"activation_func": Symbol("torch.nn.functional.silu"), "gated_linear_unit": True,
               "bias_activation_fusion": args.get("bias_swiglu_fusion", True)}
    else:
        kw["bias_activation_fusion"] = args.get("bias_gelu_fusion", True)
    if args.get("squared_relu"):
        kw["activation_func"] = Symbol("megatron.core.activations.squared_relu")
    elif args.get("quick_geglu"):
        kw |= {"activation_func": Symbol("megatron.core.fusions.fused_bias_geglu.quick_gelu"),
               "gated_linear_unit": True}
    if args.get("rope_type") is None:
        kw.pop("rope_type", None)
    cp = args.get("cp_comm_type")
    if isinstance(cp, list) and len(cp) == 1 and "cp_comm_type" in fields:
        kw["cp_comm_type"] = cp[0]
    return {k: v for k, v in kw.items() if k in fields}


def megatron_config(argv: Sequence[str], version: str, fields: Collection[str]) -> tuple[str, dict[str, Any]]:
    """(config class name, keyword arguments) of `pretrain_gpt.py <argv>` on megatron-core `version`."""
    args = settle(parse_args(argv, version))
    return config_class(args), config_kwargs(args, fields)
