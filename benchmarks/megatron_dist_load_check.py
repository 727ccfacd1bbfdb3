"""Load a torch_dist checkpoint into real megatron-core GPTModels at any TP / PP / EP, strictly, and compare every
local tensor with the TP = 1 model's.

    python benchmarks/megatron_dist_load_check.py --reference LEGACY_TP1_CKPT --spec twin-moe --out REF.pt
    torchrun --standalone --nproc_per_node 8 benchmarks/megatron_dist_load_check.py DIST_CKPT [CKPT ...] \\
        --spec twin-moe --tp 2 --pp 2 --ep 2 --expected REF.pt [--device cpu|cuda] [--json REPORT.json ...]

Step 1 (one process) builds the TP = 1 GPTModel, loads a legacy single-file checkpoint into it with
`load_state_dict(strict=True)` (the check `megatron_load_check.py` makes) and stores its global tensors, each
assembled from its own `sharded_state_dict()` entries: the reference, independent of the distributed writer.

Step 2 (every rank of a torchrun world of tp x pp x dp processes, dp = the rest; gloo on CPU, nccl on CUDA) builds
this rank's GPTModel (local spec, MTP included, `pre_process` / `post_process` by stage), loads the checkpoint the
way Megatron-LM does - `dist_checkpointing.load(model.sharded_state_dict(metadata), dir, strict=RAISE_ALL)` with
the checkpoint's content metadata, then `load_state_dict(strict=True)`; a legacy checkpoint of many ranks: this
rank's own `mp_rank_TT[_PPP][_EEE]` file, then `load_state_dict(strict=True)` - and compares each of its sharded tensors
(factories built, so a SwiGLU `linear_fc1` is its two halves) with the same region of the reference, bit for bit.
Rank 0 prints one report for the world per checkpoint (several checkpoints are checked one after the other in the
same world, each by a freshly built model; `--json` once per checkpoint); exit 1 if any rank differs or fails.

On a CPU-only torch the model is built with `alignflow.convert.mcore.cpu_construction` (router buffers on "cpu",
`Tensor.cuda()` a no-op for the last stage's MTP embedding copy) and megatron-core's load validation all-reduces
its counts on "cpu" (`cpu_collectives`); the MoE dispatcher is `allgather`. Nothing else is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from alignflow.config.model import ModelConfig  # noqa: E402
from alignflow.config.parallel import ParallelConfig  # noqa: E402
from alignflow.convert.registry import load_spec  # noqa: E402


def _model(args: argparse.Namespace) -> ModelConfig:
    if args.experiment is not None:
        from alignflow.config import load_experiment

        return load_experiment(args.experiment).model
    return load_spec(args.spec).model


def _sharded_tensors(gpt: Any) -> list[Any]:
    """The model's sharded tensors with factories built (Megatron-LM's content metadata)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    from alignflow.convert.mcore import SHARDED_METADATA

    sharded = gpt.sharded_state_dict(metadata=dict(SHARDED_METADATA))
    apply_factories(sharded)
    return [v for v in nested_values(sharded) if isinstance(v, ShardedTensor)]


def _region(sh: Any) -> tuple[slice, ...]:
    prepend = sh.prepend_axis_num
    return tuple(slice(o, o + 1) for o in sh.global_offset[:prepend]) + tuple(
        slice(o, o + s) for o, s in zip(sh.global_offset[prepend:], sh.local_shape, strict=True))


def make_reference(args: argparse.Namespace) -> int:
    """Step 1: the TP = 1 model's global tensors from a legacy checkpoint."""
    from alignflow.convert.mcore import build_gpt_model, gloo_world_of_one
    from alignflow.convert.megatron import open_megatron

    model = _model(args)
    with gloo_world_of_one():
        gpt = build_gpt_model(model, device="cpu")
        with open_megatron(args.reference) as ckpt:
            state = {k: ckpt.read(k) for k in ckpt.tensors} | dict(ckpt.others)
        result = gpt.load_state_dict(state, strict=True)
        globals_: dict[str, torch.Tensor] = {}
        for sh in _sharded_tensors(gpt):
            target = globals_.setdefault(sh.key, torch.zeros(sh.global_shape, dtype=sh.data.dtype))
            target[_region(sh)] = sh.data.detach().reshape(target[_region(sh)].shape)
    torch.save(globals_, args.out)
    print(json.dumps({"reference": str(args.out), "global_tensors": len(globals_), "strict_load": str(result)}))
    return 0


def check_rank(args: argparse.Namespace) -> int:
    """Step 2, on one rank of the torchrun world: each checkpoint in turn, one world report each."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    device = args.device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    parallel = ParallelConfig(tp=args.tp, pp=args.pp, ep=args.ep,
                              dp=dist.get_world_size() // (args.tp * args.pp))
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                                 expert_model_parallel_size=args.ep)
    ok = True
    for i, checkpoint in enumerate(args.checkpoint):
        ok &= _check_checkpoint(args, checkpoint, parallel, args.json[i] if args.json else None)
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 0 if ok else 1


def _check_checkpoint(args: argparse.Namespace, checkpoint: Path, parallel: ParallelConfig,
                      json_path: Path | None) -> bool:
    """A fresh GPTModel of this rank loads `checkpoint` and is compared with the reference; the world's report."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.validation import StrictHandling

    from alignflow.convert.layout import MEGATRON_FILE_NAME
    from alignflow.convert.mcore import build_gpt_model, cpu_collectives, megatron_core_version
    from alignflow.convert.megatron_read import detect
    from alignflow.convert.sharding import rank_file_dir

    device = args.device
    report: dict[str, Any] = {"rank": dist.get_rank(), "tp": ps.get_tensor_model_parallel_rank(),
                              "pp": ps.get_pipeline_model_parallel_rank(), "ep": ps.get_expert_model_parallel_rank()}
    try:
        gpt = build_gpt_model(_model(args), device=device, parallel=parallel)
        fmt = detect(checkpoint)
        if fmt.ckpt_format == "torch_dist":
            metadata = dist_checkpointing.load_content_metadata(str(fmt.directory))
            sharded = {"model": gpt.sharded_state_dict(metadata=metadata)}  # as Megatron-LM's generate_state_dict
            with cpu_collectives():
                loaded = dist_checkpointing.load(sharded, str(fmt.directory), strict=StrictHandling.RAISE_ALL)
        else:  # legacy: this rank's own file, as Megatron-LM's get_checkpoint_name names it
            if (fmt.parallel.tp, fmt.parallel.pp, fmt.parallel.ep) != (args.tp, args.pp, args.ep):
                raise ValueError(f"the legacy files are for tp {fmt.parallel.tp} pp {fmt.parallel.pp} ep "
                                 f"{fmt.parallel.ep}; legacy checkpoints load only at their own layout")
            name = rank_file_dir(report["tp"], report["pp"], report["ep"], parallel)
            loaded = torch.load(fmt.directory / name / MEGATRON_FILE_NAME, map_location="cpu", weights_only=True)
            report["file"] = name
        report["common"] = {k: v for k, v in loaded.items() if k != "model"}
        report["strict_load"] = str(gpt.load_state_dict(loaded["model"], strict=True))
        expected = torch.load(args.expected, map_location="cpu", weights_only=True)
        differing, compared = [], 0
        for sh in _sharded_tensors(gpt):
            want = expected[sh.key][_region(sh)].reshape(sh.local_shape)
            got = sh.data.detach().cpu()
            compared += 1
            if got.dtype != want.dtype or not torch.equal(got, want):
                differing.append(f"{sh.key} at {list(sh.global_offset)}")
        report |= {"compared": compared, "differing": differing, "ok": not differing and compared > 0}
    except Exception as exc:  # reported per rank; the world's report says which rank failed and why
        report |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    reports: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    if dist.get_rank() == 0:
        summary = {"checkpoint": str(checkpoint), "megatron_core": megatron_core_version(), "torch": torch.__version__,
                   "device": device, "tp": args.tp, "pp": args.pp, "ep": args.ep, "world": dist.get_world_size(),
                   "ok": all(r["ok"] for r in reports), "ranks": reports}
        text = json.dumps(summary, indent=2)
        print(text)
        if json_path is not None:
            Path(json_path).write_text(text)
    return all(r["ok"] for r in reports)


def main(argv: list[str] | None = None) -> int:
    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, nargs="*",
                    help="step 2: the checkpoints to check, one after the other in the same world (a torch_dist "
                         "directory, or legacy files of this layout)")
    ap.add_argument("--spec", required=True, help="conversion spec name or file (gives the model)")
    ap.add_argument("--experiment", type=Path, help="take the model section of this experiment instead")
    ap.add_argument("--reference", type=Path, help="step 1: the legacy TP = 1 checkpoint to take the reference from")
    ap.add_argument("--out", type=Path, help="step 1: where to store the reference")
    ap.add_argument("--expected", type=Path, help="step 2: the reference of step 1")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", type=Path, action="append",
                    help="step 2: also write the world's report here; once per checkpoint, in their order")
    args = ap.parse_args(argv)
    if args.json and len(args.json) != len(args.checkpoint):
        ap.error(f"{len(args.json)} --json for {len(args.checkpoint)} checkpoints: give one per checkpoint")
    if args.reference is not None:
        return make_reference(args)
    if not args.checkpoint:
        ap.error("step 2 needs a checkpoint to check (or --reference for step 1)")
    return check_rank(args)


if __name__ == "__main__":
    sys.exit(main())
