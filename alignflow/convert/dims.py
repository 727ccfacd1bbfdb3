"""Model dimensions and layer predicates that conversion specs refer to by name.

A spec writes shapes as small arithmetic expressions over named dimensions (`[(heads + 2*groups)*head_dim,
hidden]`) and conditions as predicate names (`when: [moe_layer]`); both are evaluated against the experiment's
`ModelConfig`, so one spec serves every size of a model family and a checkpoint of another size fails the
shape check instead of converting.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from alignflow.config.model import ModelConfig

# Every dimension name a shape expression may use, with where it comes from (for error messages and docs).
DIMENSIONS: dict[str, str] = {
    "hidden": "hidden_size",
    "ffn": "ffn_hidden_size",
    "vocab": "vocab_size",
    "layers": "num_layers",
    "heads": "num_attention_heads",
    "groups": "num_query_groups (default: num_attention_heads)",
    "head_dim": "kv_channels (default: hidden_size / num_attention_heads)",
    "experts": "moe.num_experts",
    "moe_ffn": "moe.ffn_hidden_size",
    "shared_ffn": "moe.shared_expert_intermediate_size",
    "q_lora": "mla.q_lora_rank",
    "kv_lora": "mla.kv_lora_rank",
    "qk_head": "mla.qk_head_dim",
    "qk_pos": "mla.qk_pos_emb_head_dim",
    "v_head": "mla.v_head_dim",
    "index_heads": "dsa.index_n_heads",
    "index_head_dim": "dsa.index_head_dim",
    "conv_kernel": "linear_attention.conv_kernel_dim",
    "lk_heads": "linear_attention.num_key_heads",
    "lk_dim": "linear_attention.key_head_dim",
    "lv_heads": "linear_attention.num_value_heads",
    "lv_dim": "linear_attention.value_head_dim",
}


def model_dimensions(model: ModelConfig) -> dict[str, int]:
    """The named dimensions of `model`; names of absent sections (no MoE, no MLA, ...) are left out."""
    d: dict[str, int] = {
        "hidden": model.hidden_size,
        "ffn": model.ffn_hidden_size,
        "vocab": model.vocab_size,
        "layers": model.num_layers,
        "heads": model.num_attention_heads,
        "groups": model.query_groups,
        "head_dim": model.head_dim,
    }
    if model.moe is not None:
        d["experts"] = model.moe.num_experts
        d["moe_ffn"] = model.moe.ffn_hidden_size
        if model.moe.shared_expert_intermediate_size is not None:
            d["shared_ffn"] = model.moe.shared_expert_intermediate_size
    if model.mla is not None:
        if model.mla.q_lora_rank is not None:
            d["q_lora"] = model.mla.q_lora_rank
        d |= {"kv_lora": model.mla.kv_lora_rank, "qk_head": model.mla.qk_head_dim,
              "qk_pos": model.mla.qk_pos_emb_head_dim, "v_head": model.mla.v_head_dim}
    if model.dsa is not None:
        d |= {"index_heads": model.dsa.index_n_heads, "index_head_dim": model.dsa.index_head_dim}
    la = model.linear_attention
    if la is not None:
        d |= {"conv_kernel": la.conv_kernel_dim, "lk_heads": la.num_key_heads, "lk_dim": la.key_head_dim,
              "lv_heads": la.num_value_heads, "lv_dim": la.value_head_dim}
    return d


class ExpressionError(ValueError):
    """A shape expression is malformed or names a dimension the model does not have."""


_BINOPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
}


@lru_cache(maxsize=4096)
def parse_expression(text: str) -> ast.Expression:
    """Parse and check an expression: integers, dimension names, + - * // and parentheses only."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"malformed shape expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in DIMENSIONS:
                raise ExpressionError(f"unknown dimension {node.id!r} in {text!r}; known: {', '.join(DIMENSIONS)}")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                raise ExpressionError(f"only integer constants are allowed in {text!r}")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise ExpressionError(f"only + - * // are allowed in {text!r}")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub):
                raise ExpressionError(f"only unary minus is allowed in {text!r}")
        elif not isinstance(node, ast.Expression | ast.Load | ast.operator | ast.unaryop):
            raise ExpressionError(f"unsupported syntax {type(node).__name__} in {text!r}")
    return tree


def evaluate(expr: int | str, dims: dict[str, int]) -> int:
    """Evaluate one shape expression (an int passes through)."""
    if isinstance(expr, int):
        return expr
    return _eval(parse_expression(expr).body, dims, expr)


def _eval(node: ast.expr, dims: dict[str, int], text: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in dims:
            raise ExpressionError(f"{text!r} needs {node.id!r} ({DIMENSIONS[node.id]}), which the model does not set")
        return dims[node.id]
    if isinstance(node, ast.UnaryOp):
        return -_eval(node.operand, dims, text)
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_eval(node.left, dims, text), _eval(node.right, dims, text))
    raise ExpressionError(f"unsupported syntax in {text!r}")


def _is_full_attention(model: ModelConfig, layer: int | None) -> bool:
    la = model.linear_attention
    return layer is not None and (la is None or (layer + 1) % la.freq == 0)


# Predicate name -> test on (model, decoder layer index or None for model-level keys). The MTP inner layer is
# tested with the last decoder layer's index: Megatron builds it from the last decoder layer's spec.
PREDICATES: dict[str, Callable[[ModelConfig, int | None], bool]] = {
    "moe_layer": lambda m, i: i is not None and m.is_moe_layer(i),
    "dense_layer": lambda m, i: i is not None and not m.is_moe_layer(i),
    "full_attention_layer": _is_full_attention,
    "linear_attention_layer": lambda m, i: i is not None and not _is_full_attention(m, i),
    "expert_bias": lambda m, i: m.moe is not None and m.moe.router_enable_expert_bias,
    "shared_expert": lambda m, i: m.moe is not None and m.moe.shared_expert_intermediate_size is not None,
    "shared_expert_gate": lambda m, i: m.moe is not None and m.moe.shared_expert_gate,
    "qk_layernorm": lambda m, i: m.qk_layernorm,
    "untied_output": lambda m, i: m.untie_embeddings_and_output_weights,
    "mtp": lambda m, i: m.mtp is not None,
    "mla": lambda m, i: m.mla is not None,
    "q_lora": lambda m, i: m.mla is not None and m.mla.q_lora_rank is not None,
    "dsa": lambda m, i: m.dsa is not None,
}


def model_field(model: ModelConfig, dotted: str) -> Any:
    """`model.moe.num_experts` by its dotted path; None where a section on the way is unset (or no such field)."""
    value: Any = model
    for part in dotted.split("."):
        value = getattr(value, part, None) if value is not None else None
    return value
