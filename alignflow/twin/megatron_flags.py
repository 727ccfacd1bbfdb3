"""Megatron-LM `pretrain_gpt.py` command-line flags: parse them, reject unknown ones by name, read the model.

This is the PyTorch twin's argument parser and the way alignflow reads a Megatron command line (preflight's
`gpu.py` reuses `parse_megatron_args`, not `model_config_from_megatron`). Flag names, defaults and meanings are
Megatron's (`megatron/training/arguments.py`): e.g. dropout defaults to 0.1, `--lr-decay-style` to linear,
`--split` to `969, 30, 1`, `--transformer-impl` to transformer_engine, and `NullTokenizer`'s vocabulary depends
on the version (`alignflow.frameworks.megatron_versions.null_tokenizer`). Flags the twin does not implement are
rejected, each by name; flags that only tune kernels (`--no-*-fusion`) or place caches (`--data-cache-path`) are
accepted and have no effect on the twin.

The twin has no flags of its own: a command line it accepts is one real Megatron-LM accepts. Its own settings come
from its environment (`alignflow.twin.render.twin_env`): ALIGNFLOW_TWIN_DATA_SHA256 (the data must hash to it),
ALIGNFLOW_TWIN_MEGATRON_VERSION (the megatron-core version whose formats and flags to reproduce: NullTokenizer,
MTP inner-layer name, log timestamp; default 0.16) and ALIGNFLOW_TWIN_DEVICE (auto, cpu, cuda).
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Sequence
from typing import Any

from alignflow.config.model import ModelConfig, MoEConfig, MTPConfig
from alignflow.errors import ConfigError

WHERE = "torch_train"
_NO_OP_SWITCHES = (
    "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion", "--no-bias-dropout-fusion",
    "--no-bias-gelu-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
    "--no-one-logger", "--use-cpu-initialization", "--attention-softmax-in-fp32", "--use-mcore-models",
    "--no-create-attention-mask-in-dataloader", "--exit-on-missing-checkpoint", "--no-load-rng",
    "--no-save-rng", "--no-async-tensor-model-parallel-allreduce", "--deterministic-mode",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would sys.exit; the CLI chooses exit codes
        raise ConfigError(f"{WHERE}: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m alignflow.twin.torch_train", allow_abbrev=False, add_help=True,
                description="The twin's PyTorch side (Megatron-LM pretrain_gpt.py flags).")
    m = p.add_argument_group("model")
    m.add_argument("--num-layers", type=int, required=True)
    m.add_argument("--hidden-size", type=int, required=True)
    m.add_argument("--ffn-hidden-size", type=int)
    m.add_argument("--num-attention-heads", type=int, required=True)
    m.add_argument("--group-query-attention", action="store_true")
    m.add_argument("--num-query-groups", type=int, default=1)
    m.add_argument("--kv-channels", type=int)
    m.add_argument("--seq-length", type=int, required=True)
    m.add_argument("--max-position-embeddings", type=int)
    m.add_argument("--position-embedding-type", default="learned_absolute",
                   choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    m.add_argument("--rotary-base", type=float, default=10000.0)
    m.add_argument("--rotary-percent", type=float, default=1.0)
    m.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    m.add_argument("--norm-epsilon", type=float, default=1e-5)
    m.add_argument("--swiglu", action="store_true")
    m.add_argument("--disable-bias-linear", action="store_true")
    m.add_argument("--qk-layernorm", action="store_true")
    m.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    m.add_argument("--vocab-size", type=int, required=True)
    m.add_argument("--null-tokenizer-eod-id", type=int)
    m.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    m.add_argument("--init-method-std", type=float, default=0.02)
    m.add_argument("--attention-dropout", type=float, default=0.1)
    m.add_argument("--hidden-dropout", type=float, default=0.1)
    e = p.add_argument_group("moe / mtp")
    e.add_argument("--num-experts", type=int)
    e.add_argument("--moe-router-topk", type=int, default=2)
    e.add_argument("--moe-ffn-hidden-size", type=int)
    e.add_argument("--moe-shared-expert-intermediate-size", type=int)
    e.add_argument("--moe-shared-expert-gate", action="store_true")
    e.add_argument("--moe-layer-freq", default="1")
    e.add_argument("--moe-router-load-balancing-type", default="aux_loss",
                   choices=["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"])
    e.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    e.add_argument("--moe-z-loss-coeff", type=float)
    e.add_argument("--moe-router-score-function", default="softmax", choices=["softmax", "sigmoid"])
    e.add_argument("--moe-router-enable-expert-bias", action="store_true")
    e.add_argument("--moe-router-bias-update-rate", type=float, default=1e-3)
    e.add_argument("--moe-router-topk-scaling-factor", type=float)
    e.add_argument("--moe-router-dtype", choices=["fp32", "fp64"])
    e.add_argument("--moe-token-dispatcher-type", default="allgather", choices=["allgather", "alltoall", "flex"])
    e.add_argument("--moe-grouped-gemm", action="store_true")
    e.add_argument("--mtp-num-layers", type=int)
    e.add_argument("--mtp-loss-scaling-factor", type=float, default=0.1)
    t = p.add_argument_group("training")
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--train-iters", type=int, required=True)
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--min-lr", type=float, default=0.0)
    t.add_argument("--lr-warmup-iters", type=int, default=0)
    t.add_argument("--lr-warmup-init", type=float, default=0.0)
    t.add_argument("--lr-decay-style", default="linear",
                   choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    t.add_argument("--lr-decay-iters", type=int)
    t.add_argument("--clip-grad", type=float, default=1.0)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--adam-beta1", type=float, default=0.9)
    t.add_argument("--adam-beta2", type=float, default=0.999)
    t.add_argument("--adam-eps", type=float, default=1e-8)
    t.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    t.add_argument("--micro-batch-size", type=int, required=True)
    t.add_argument("--global-batch-size", type=int)
    t.add_argument("--log-interval", type=int, default=100)
    t.add_argument("--bf16", action="store_true")
    t.add_argument("--recompute-granularity", choices=["full", "selective"])
    t.add_argument("--recompute-method", choices=["uniform", "block"])
    t.add_argument("--recompute-num-layers", type=int)
    t.add_argument("--no-bias-swiglu-fusion", action="store_true",
                   help="without it, SwiGLU is megatron's fused SwiGLUFunction (its hand-written backward)")
    t.add_argument("--fp16", action="store_true")
    d = p.add_argument_group("data")
    d.add_argument("--data-path", nargs="*")
    d.add_argument("--mock-data", action="store_true")
    d.add_argument("--split", default="969, 30, 1")
    d.add_argument("--dataloader-type", default="single", choices=["single", "cyclic", "external"])
    d.add_argument("--tokenizer-type")
    d.add_argument("--data-cache-path", help="accepted; the twin writes no index cache")
    d.add_argument("--eval-iters", type=int, default=100)
    d.add_argument("--eval-interval", type=int, default=1000)
    c = p.add_argument_group("checkpointing")
    c.add_argument("--load")
    c.add_argument("--save")
    c.add_argument("--save-interval", type=int)
    c.add_argument("--finetune", action="store_true")
    c.add_argument("--no-load-optim", action="store_true")
    c.add_argument("--no-save-optim", action="store_true")
    c.add_argument("--ckpt-format", default="torch_dist", choices=["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"])
    c.add_argument("--transformer-impl", default="transformer_engine", choices=["local", "transformer_engine"])
    par = p.add_argument_group("parallelism (the twin: tensor, pipeline and data parallel)")
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size",
                 "--context-parallel-size"):
        par.add_argument(flag, type=int, default=1)
    par.add_argument("--distributed-backend", default="nccl", choices=["nccl", "gloo"])
    for flag in _NO_OP_SWITCHES:
        par.add_argument(flag, action="store_true", help="accepted; no effect on the twin")
    return p


def parse_megatron_args(argv: Sequence[str], *, strict: bool = True) -> argparse.Namespace:
    """Parse a Megatron command line; unknown flags and unsupported values raise `ConfigError` naming them.

    `strict=False` reads a real Megatron command line (preflight): flags this parser does not know are kept in
    `ns.unknown_args` instead of raising, and the twin's own limits (data file, split, parallelism, ...) are not
    checked; missing required flags and malformed values still raise.
    """
    ns, unknown = _parser().parse_known_args(list(argv))
    ns.unknown_args = list(unknown)
    if not strict:
        return ns
    problems = [f"unknown flag {u!r} (not a Megatron flag the twin implements)" for u in unknown
                if u.startswith("-")]
    problems += [f"unexpected argument {u!r}" for u in unknown if not u.startswith("-")]
    problems += _unsupported(ns)
    if problems:
        raise ConfigError([("", None, f"{WHERE}: {p}") for p in problems])
    return ns


def _unsupported(ns: argparse.Namespace) -> list[str]:
    rules: list[tuple[bool, str]] = [
        (ns.fp16, "--fp16: the twin trains in fp32 (with --bf16 parameter write-back at most)"),
        (ns.optimizer != "adam", f"--optimizer {ns.optimizer}: the twin implements adam (AdamW) only"),
        (ns.mock_data, "--mock-data: the twin reads a data file (--data-path)"),
        (ns.dataloader_type != "single", f"--dataloader-type {ns.dataloader_type}: only single keeps the sample "
         "order of the other side (docs/seeds.md#data-order)"),
        (ns.tokenizer_type != "NullTokenizer", f"--tokenizer-type {ns.tokenizer_type}: the twin reads token ids "
         "(NullTokenizer)"),
        (ns.lr_decay_style in ("inverse-square-root", "WSD"), f"--lr-decay-style {ns.lr_decay_style}: the twin "
         "implements constant, linear and cosine"),
        (ns.ckpt_format not in ("torch", "torch_dist") and bool(ns.load), f"--ckpt-format {ns.ckpt_format}: the "
         "twin loads torch (legacy) and torch_dist checkpoints"),
        (ns.ckpt_format != "torch" and bool(ns.save), f"--ckpt-format {ns.ckpt_format} with --save: the twin saves "
         "the legacy torch format only (--ckpt-format torch)"),
        (ns.global_batch_size is not None and ns.global_batch_size % ns.micro_batch_size != 0,
         "--global-batch-size must be a multiple of --micro-batch-size (one data-parallel rank)"),
        (not ns.data_path, "--data-path: required (the indexed dataset's prefix)"),
        (ns.eval_iters > 0 and ns.eval_interval <= ns.train_iters, "evaluation is not implemented by the twin; "
         "pass --eval-iters 0"),
        (ns.recompute_granularity == "selective", "--recompute-granularity selective: the twin recomputes whole "
         "layers only (full)"),
        (ns.recompute_granularity == "full" and ns.recompute_method is None, "--recompute-granularity full needs "
         "--recompute-method uniform or block (megatron-core TransformerConfig refuses full recompute without one)"),
        (ns.recompute_method is not None and ns.recompute_granularity != "full", "--recompute-method applies to "
         "--recompute-granularity full only"),
        (ns.recompute_method == "block", "--recompute-method block: the twin recomputes uniform chunks only"),
        (ns.recompute_num_layers is not None and ns.recompute_num_layers < 1, "--recompute-num-layers must be "
         "at least 1"),
    ]
    problems = [msg for bad, msg in rules if bad]
    for flag in ("expert_model_parallel_size", "context_parallel_size"):
        if getattr(ns, flag) != 1:
            problems.append(f"--{flag.replace('_', '-')} {getattr(ns, flag)}: the twin has tensor, pipeline and data "
                            "parallelism only")
    if ns.data_path and len(ns.data_path) not in (1, 2):
        problems.append(f"--data-path {' '.join(ns.data_path)}: expected one prefix (optionally with weight 1)")
    try:
        if split_fractions(ns.split)[0] != 1.0:
            problems.append(f"--split {ns.split!r}: the twin trains on the whole file; pass --split 100,0,0")
    except ValueError:
        problems.append(f"--split {ns.split!r}: expected comma-separated weights")
    return problems


def split_fractions(split: str) -> tuple[float, ...]:
    parts = [float(x) for x in split.replace("/", ",").split(",") if x.strip()]
    total = sum(parts)
    if not parts or total <= 0:
        raise ValueError(split)
    return tuple(x / total for x in parts)


def data_file(ns: argparse.Namespace) -> str:
    """The single `--data-path` prefix (Megatron allows `[weight] prefix` pairs; the twin takes one dataset)."""
    paths: list[str] = list(ns.data_path)
    return paths[-1]


def moe_layer_pattern(freq: str, num_layers: int) -> list[int]:
    """Megatron `--moe-layer-freq`: an int N (every N-th layer is MoE) or a list expression `([0]+[1]*3)`."""
    try:
        value = _eval_list_expr(ast.parse(freq.strip(), mode="eval").body)
    except (SyntaxError, ValueError):
        raise ConfigError(f"{WHERE}: --moe-layer-freq {freq!r}: expected an integer or a list expression such "
                          "as [0,1,1,1] or ([0]*1+[1]*3)") from None
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{WHERE}: --moe-layer-freq {freq!r} must be positive")
        return [1 if i % value == 0 else 0 for i in range(num_layers)]
    if len(value) != num_layers:
        raise ConfigError(f"{WHERE}: --moe-layer-freq {freq!r} has {len(value)} entries for --num-layers {num_layers}")
    return value


def _eval_list_expr(node: ast.expr) -> int | list[int]:
    """Evaluate ints, lists of ints, `list + list` and `list * int` — nothing else (no eval())."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.List):
        items = [_eval_list_expr(e) for e in node.elts]
        if all(isinstance(i, int) for i in items):
            return [int(i) for i in items]  # type: ignore[arg-type]
    if isinstance(node, ast.BinOp):
        left, right = _eval_list_expr(node.left), _eval_list_expr(node.right)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int):
            return left * right
    raise ValueError("unsupported expression")


def padded_vocab_size(ns: argparse.Namespace, megatron_version: str) -> tuple[int, int]:
    """(tokenizer vocabulary, padded vocabulary) of megatron-core `megatron_version`'s NullTokenizer."""
    from alignflow.frameworks.megatron_versions import null_tokenizer

    orig, _ = null_tokenizer(megatron_version).vocab_and_eod(int(ns.vocab_size), ns.null_tokenizer_eod_id)
    d = int(ns.make_vocab_size_divisible_by) * int(ns.tensor_model_parallel_size)
    return orig, -(-orig // d) * d


def eod_id(ns: argparse.Namespace, megatron_version: str) -> int:
    """NullTokenizer's end-of-document id for these flags on megatron-core `megatron_version`."""
    from alignflow.frameworks.megatron_versions import null_tokenizer

    return null_tokenizer(megatron_version).vocab_and_eod(int(ns.vocab_size), ns.null_tokenizer_eod_id)[1]


def model_config_from_megatron(ns: argparse.Namespace, *, family: str = "megatron",
                               megatron_version: str = "0.16") -> ModelConfig:
    """The `ModelConfig` a Megatron command line describes (vocab_size = the padded embedding rows)."""
    hidden = int(ns.hidden_size)
    ffn = ns.ffn_hidden_size
    if ffn is None:  # megatron arguments.py: 4h, and 2/3 of it rounded to 64 for SwiGLU
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if ns.swiglu else 4 * hidden
    moe = None
    if ns.num_experts:
        moe = MoEConfig(
            num_experts=ns.num_experts, router_topk=ns.moe_router_topk,
            ffn_hidden_size=ns.moe_ffn_hidden_size or ffn,
            shared_expert_intermediate_size=ns.moe_shared_expert_intermediate_size,
            shared_expert_gate=ns.moe_shared_expert_gate, router_score_function=ns.moe_router_score_function,
            router_enable_expert_bias=ns.moe_router_enable_expert_bias,
            router_bias_update_rate=ns.moe_router_bias_update_rate,
            router_topk_scaling_factor=ns.moe_router_topk_scaling_factor,
            load_balancing_type=ns.moe_router_load_balancing_type
            if ns.moe_router_load_balancing_type in ("aux_loss", "seq_aux_loss", "none") else "none",
            aux_loss_coeff=ns.moe_aux_loss_coeff, z_loss_coeff=ns.moe_z_loss_coeff,
            layer_freq=moe_layer_pattern(ns.moe_layer_freq, ns.num_layers), router_dtype=ns.moe_router_dtype
            if ns.moe_router_dtype != "fp64" else "fp32",
        )
    _, padded = padded_vocab_size(ns, megatron_version)
    if ns.position_embedding_type not in ("rope", "none"):
        raise ConfigError(f"{WHERE}: --position-embedding-type {ns.position_embedding_type}: alignflow models "
                          "use rope (or none)")
    try:
        return ModelConfig(
            family=family, num_layers=ns.num_layers, hidden_size=hidden, ffn_hidden_size=ffn,
            num_attention_heads=ns.num_attention_heads,
            num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
            kv_channels=ns.kv_channels, vocab_size=padded,
            make_vocab_size_divisible_by=ns.make_vocab_size_divisible_by, seq_length=ns.seq_length,
            max_position_embeddings=ns.max_position_embeddings,
            position_embedding_type=ns.position_embedding_type,
            rotary_base=ns.rotary_base, rotary_percent=ns.rotary_percent, normalization=ns.normalization,
            norm_epsilon=ns.norm_epsilon, activation="silu" if ns.swiglu else "gelu", gated_linear_unit=ns.swiglu,
            add_bias_linear=not ns.disable_bias_linear, qk_layernorm=ns.qk_layernorm,
            untie_embeddings_and_output_weights=ns.untie_embeddings_and_output_weights,
            hidden_dropout=ns.hidden_dropout, attention_dropout=ns.attention_dropout,
            init_method_std=ns.init_method_std, moe=moe,
            mtp=MTPConfig(num_layers=ns.mtp_num_layers, loss_scaling_factor=ns.mtp_loss_scaling_factor)
            if ns.mtp_num_layers else None,
        )
    except ValueError as exc:  # pydantic.ValidationError is a ValueError
        raise ConfigError(f"{WHERE}: the model flags are inconsistent: {exc}") from None
