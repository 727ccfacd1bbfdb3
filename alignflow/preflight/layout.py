"""The parallel layout of each side as its command will run, and whether the global batch fits it.

Both sides must consume the same samples per optimizer step whatever their layouts: the same global batch, in
the same order, which holds when each side's global batch is a multiple of its micro batch times its data-parallel
size (`alignflow.config.parallel`). Read from what runs - the launcher in the command line (torchrun's
`--nproc_per_node x --nnodes`, msrun's `--worker_num`), Megatron's `--*-parallel-size` flags, MindFormers'
`parallelism` section - not from the experiment, so a hand-edited `extra_args` or template is seen too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from alignflow.config.model import ModelConfig
from alignflow.config.parallel import ParallelConfig
from alignflow.preflight.values import Value


def _last(argv: Sequence[str], *flags: str) -> str | None:
    """The value of the last of `flags` in argv (`--f v` or `--f=v`), as argparse keeps the last one."""
    found = None
    for i, token in enumerate(argv):
        for flag in flags:
            if token == flag and i + 1 < len(argv):
                found = argv[i + 1]
            elif token.startswith(flag + "="):
                found = token.split("=", 1)[1]
    return found


def launcher_world(argv: Sequence[str]) -> tuple[int, str]:
    """Processes the command starts, and where that was read."""
    if "torch.distributed.run" in argv or any(a.endswith("torchrun") for a in argv):
        per = _last(argv, "--nproc_per_node", "--nproc-per-node") or "1"
        nodes = (_last(argv, "--nnodes") or "1").split(":")[-1]
        return int(per) * int(nodes), f"torchrun --nproc_per_node {per} --nnodes {nodes}"
    if "msrun" in argv:
        workers = _last(argv, "--worker_num") or "1"
        return int(workers), f"msrun --worker_num {workers}"
    return 1, "no launcher: one process"


def gpu_layout(flags: Sequence[str], world: int, world_source: str) -> dict[str, Value]:
    tp = int(_last(flags, "--tensor-model-parallel-size") or 1)
    pp = int(_last(flags, "--pipeline-model-parallel-size") or 1)
    cp = int(_last(flags, "--context-parallel-size") or 1)
    ep = int(_last(flags, "--expert-model-parallel-size") or 1)
    s = {"parallel.world": Value(world, world_source), "parallel.tp": Value(tp, "--tensor-model-parallel-size"),
         "parallel.pp": Value(pp, "--pipeline-model-parallel-size"),
         "parallel.ep": Value(ep, "--expert-model-parallel-size")}
    s["parallel.dp"] = Value(world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 0,
                             f"world {world} / (tp {tp} x pp {pp} x cp {cp})")
    return s


def npu_layout(config: Mapping[str, Any], world: int, world_source: str) -> dict[str, Value]:
    par = config.get("parallelism") if isinstance(config.get("parallelism"), Mapping) else {}
    assert isinstance(par, Mapping)
    tp, pp = int(par.get("tensor_parallel", 1) or 1), int(par.get("pipeline_parallel", 1) or 1)
    cp, ep = int(par.get("context_parallel", 1) or 1), int(par.get("expert_parallel", 1) or 1)
    shard = par.get("data_parallel_shard", -1)
    s = {"parallel.world": Value(world, world_source), "parallel.tp": Value(tp, "parallelism.tensor_parallel"),
         "parallel.pp": Value(pp, "parallelism.pipeline_parallel"),
         "parallel.ep": Value(ep, "parallelism.expert_parallel")}
    if shard in (None, -1):
        derived = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 0
        s["parallel.dp"] = Value(derived, f"parallelism.data_parallel_shard -1: world {world} / (tp {tp} x pp {pp} "
                                 f"x cp {cp})")
    else:
        s["parallel.dp"] = Value(int(shard), "parallelism.data_parallel_shard")
    return s


def batch_fits(settings: Mapping[str, Value]) -> Value:
    """`global batch % (micro batch x dp) == 0`, with the numbers in the source."""
    gbs, mbs, dp = (settings.get(k) for k in ("train.global_batch_size", "train.micro_batch_size", "parallel.dp"))
    if gbs is None or mbs is None or dp is None or gbs.missing or mbs.missing or not dp.value:
        return Value(False, "the parallel layout does not divide the world size, or the batch sizes are missing")
    accumulation, rest = divmod(int(gbs.value), int(mbs.value) * int(dp.value))
    text = f"global batch {gbs.value} = micro batch {mbs.value} x dp {dp.value} x {accumulation} accumulation step(s)"
    return Value(rest == 0 and accumulation > 0, text if rest == 0 else
                 f"global batch {gbs.value} is not a multiple of micro batch {mbs.value} x dp {dp.value}")


def checkpoint_loads(gpu_flags: Sequence[str], convert_argv: Sequence[str] | None, model: ModelConfig) -> Value:
    """Whether a Megatron-kind training's layout loads the checkpoint it is given (`convert_argv`: the flags of the
    conversion step that writes it, or `--ckpt-format torch_dist` for a torch_dist base), read from both
    commands (`--ckpt-format`, the parallel sizes) with megatron-core's rules (`alignflow.convert.layout.
    checkpoint_load_problems`, `alignflow.convert.sharding.layout_problems`)."""
    from alignflow.convert.layout import checkpoint_load_problems
    from alignflow.convert.sharding import layout_problems

    train = ParallelConfig(tp=int(_last(gpu_flags, "--tensor-model-parallel-size") or 1),
                           pp=int(_last(gpu_flags, "--pipeline-model-parallel-size") or 1),
                           ep=int(_last(gpu_flags, "--expert-model-parallel-size") or 1))
    train_fmt = _last(gpu_flags, "--ckpt-format") or "torch_dist"  # Megatron-LM's default
    if convert_argv is None:
        return Value(True, "no step of the run lays the checkpoint out (a given or trained legacy base): not checked")
    ckpt_fmt = _last(convert_argv, "--ckpt-format") or "torch"
    ckpt = ParallelConfig(tp=int(_last(convert_argv, "--tp") or 1), pp=int(_last(convert_argv, "--pp") or 1),
                          ep=int(_last(convert_argv, "--ep") or 1))
    problems = checkpoint_load_problems((ckpt_fmt, ckpt), (train_fmt, train))
    if not problems:
        problems = layout_problems(model, train)
    text = (f"{ckpt_fmt} checkpoint" + ("" if ckpt_fmt == "torch_dist" else f" for tp {ckpt.tp} pp {ckpt.pp} ep "
                                       f"{ckpt.ep}") + f", training at tp {train.tp} pp {train.pp} ep {train.ep}")
    return Value(not problems, "; ".join(problems) if problems else text)
