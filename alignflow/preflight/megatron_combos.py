"""Combinations a megatron-core version refuses although its argument parser accepts every flag.

`megatron_lm.check_flags` proves `pretrain_gpt.py`'s parser takes the command line; this module checks what
fails after parsing, on the GPU host, from Megatron-LM's code for each supported version
(`alignflow.frameworks.megatron_versions` cites each): a version alignflow does not accept (0.20, Megatron-LM main,
is refused by name), a fused kernel whose extension the host lacks, no `--eval-interval`, `--deterministic-mode`
with an environment it refuses, a warm-up not shorter than the decay (`OptimizerParamScheduler` asserts
`lr_warmup_steps < lr_decay_steps`), Transformer Engine asked for on a host without it — naming what in the model
needs it —, and every row of `alignflow.frameworks.megatron_refusals` (what the real config classes, layer specs and
model constructors refuse: DSA with RoPE fusion, an attention variant or MLA without TE, ...), each with Megatron's
own message and its source line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from alignflow.convert.layout import MegatronVersionError, parse_version
from alignflow.errors import ConfigError
from alignflow.frameworks.megatron_config import parse_args, settle
from alignflow.frameworks.megatron_refusals import FIXES_ARG, needs_te_what, refusals, te_requirements
from alignflow.frameworks.megatron_versions import APEX, TE, accepted_problem, determinism_env_problems
from alignflow.twin.megatron_flags import parse_megatron_args


def combination_problems(argv: Sequence[str], *, env: Mapping[str, str], version: str,
                         extensions: Collection[str] | None,
                         fixes: Collection[str] = ()) -> tuple[bool | None, list[str]]:
    """(accepted?, problems) of `pretrain_gpt.py <argv>` on megatron-core `version` with `extensions` and `env`;
    None when `version` is not one alignflow knows. `fixes`: the side's declared Megatron fixes (their names).
    `extensions` None (no host known): the fused-kernel switches
    are checked as for a host without extensions, Transformer Engine itself is not questioned."""
    try:
        v = parse_version(version)
    except MegatronVersionError as exc:
        return False, [str(exc)]
    not_accepted = accepted_problem(version)
    if not_accepted is not None:
        return False, [not_accepted]
    series = f"{v[0]}.{v[1]}"
    try:
        ns = parse_megatron_args(argv, strict=False)
        args = {**settle(parse_args(argv, series, strict=False)), FIXES_ARG: frozenset(fixes)}
    except ConfigError as exc:
        return False, [str(exc)]
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    has = set(extensions or ())
    host = f"the GPU host ({', '.join(sorted(has)) or 'no Transformer Engine, no Apex'})"
    problems: list[str] = []
    if "--eval-interval" not in given and ns.train_iters is not None:
        problems.append(f"--eval-interval not given: megatron-core {version} computes train_iters // eval_interval "
                        "with eval_interval None (TypeError: unsupported operand type(s) for //: 'int' and "
                        "'NoneType'), even with --eval-iters 0")
    if ns.transformer_impl == "transformer_engine" and extensions is not None and TE not in has:
        needs = te_requirements(args, series)
        why = "; ".join(f"{needs_te_what(r, args)}: without it megatron-core {series} stops at {r.level} level "
                        f"with {r.error} ({r.source[series]})" for r in needs)
        problems.append(f"--transformer-impl transformer_engine on {host}"
                        + (f": this model needs Transformer Engine — {why}" if needs else "")
                        + "; run it on a host with Transformer Engine, or declare `cuda_extensions: "
                        "[transformer_engine]` for that host in hosts.yaml if it has it")
    problems += [r.line(series) for r in refusals(args, series)]
    if ns.transformer_impl == "local":
        if ns.position_embedding_type == "rope" and TE not in has and "--no-rope-fusion" not in given:
            problems.append(f"RoPE fusion on {host}: give --no-rope-fusion (ValueError: apply_rope_fusion is not "
                            "available. Please install TE >= 1.4.)")
        if (APEX not in has or ns.normalization == "RMSNorm") and "--no-persist-layer-norm" not in given:
            problems.append(f"persistent layer norm with {ns.normalization} on {host}: give --no-persist-layer-norm "
                            "(AssertionError: persist_layer_norm not supported by torch LayerNorm)")
        if APEX not in has and "--no-gradient-accumulation-fusion" not in given:
            problems.append(f"gradient-accumulation fusion on {host}: give --no-gradient-accumulation-fusion "
                            "(RuntimeError: ColumnParallelLinear was called with gradient_accumulation_fusion set "
                            "to True but the custom CUDA extension fused_weight_gradient_mlp_cuda module is not "
                            "found)")
    if ns.deterministic_mode:
        problems += determinism_env_problems(env, version)
    decay = ns.lr_decay_iters or ns.train_iters
    if decay is not None and ns.lr_warmup_iters >= decay:
        problems.append(f"--lr-warmup-iters {ns.lr_warmup_iters} >= decay steps {decay}: OptimizerParamScheduler "
                        "asserts lr_warmup_steps < lr_decay_steps")
    return not problems, problems
