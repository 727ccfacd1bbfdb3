"""Load a converted Megatron legacy checkpoint into a real megatron-core GPTModel with `strict=True`.

    python benchmarks/megatron_load_check.py CKPT_DIR --spec twin-moe [--device cpu|cuda] [--json]

Builds the model of the spec's default configuration (or `--experiment FILE`'s model section) with the LOCAL
layer spec (`--transformer-impl local`), MTP block included, loads `model_optim_rng.pt` the way Megatron does
(`torch.load(weights_only=True)` after `import megatron.core`), calls `load_state_dict(strict=True)` and then
checks that every tensor in the model equals the checkpoint's bit for bit. Exit 0 when all holds, 1 otherwise.

Written to run unchanged on a CPU with megatron-core 0.16.1 (the test suite) and on a GPU with a newer
megatron-core (the MTP inner layer name follows the installed version: `transformer_layer` up to 0.16,
`mtp_model_layer` from 0.17; convert with the same `--megatron-version`).

CPU-only torch and megatron-core 0.16.1 need two accommodations, both scoped to model construction:
- the MoE token dispatcher is `allgather` (`alltoall` creates a CUDA stream);
- `torch.cuda.current_device` is redirected to "cpu" while the model is built, because the router allocates
  its expert-bias buffers on `torch.cuda.current_device()`. This monkeypatch is undone as soon as the model
  exists; nothing else is faked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from alignflow.convert import load_spec
from alignflow.convert.mcore import build_gpt_model  # the converter's own model builder, at TP = PP = 1
from alignflow.convert.megatron import open_megatron
from alignflow.convert.plan import mtp_inner_layer


def megatron_version() -> str:
    import megatron.core

    return str(megatron.core.__version__)


@contextmanager
def model_parallel(device: str) -> Iterator[None]:
    """A world of one (gloo on CPU, nccl on CUDA) with TP = PP = 1; torn down on exit.

    The rendezvous is a file store in a private temporary directory, not a TCP port: tests run beside other
    processes on shared machines, and a fixed MASTER_PORT collides.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if device == "cuda":
        torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory(prefix="mcore-world-") as tmp:
        created = not dist.is_initialized()
        if created:
            dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/store",
                                    rank=0, world_size=1)
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        if device == "cuda":
            model_parallel_cuda_manual_seed(1234)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
            if created:
                dist.destroy_process_group()


def load_into(gpt: Any, ckpt_dir: Path) -> dict[str, Any]:
    """`load_state_dict(strict=True)` of the checkpoint, then a bit-exact comparison of every tensor."""
    import megatron.core  # noqa: F401 - Megatron's weights_only safe globals, as in a real load

    with open_megatron(ckpt_dir) as ckpt:
        state = {k: ckpt.read(k) for k in ckpt.tensors} | dict(ckpt.others)
    result = gpt.load_state_dict(state, strict=True)
    loaded = gpt.state_dict()
    differing = []
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and not key.endswith("._extra_state"):
            mine = loaded[key].detach().cpu().to(value.dtype)
            if mine.shape != value.shape or not torch.equal(mine, value):
                differing.append(key)
    params = [k for k, v in loaded.items() if isinstance(v, torch.Tensor) and not k.endswith("._extra_state")]
    return {"strict_load": str(result), "model_tensors": len(params), "checkpoint_tensors": len(ckpt.tensors),
            "differing": differing, "ok": not differing and len(params) == len(ckpt.tensors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="Megatron legacy checkpoint directory (tracker inside)")
    parser.add_argument("--spec", required=True, help="conversion spec name or file (gives the model)")
    parser.add_argument("--experiment", type=Path, help="take the model section of this experiment instead")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dispatcher", choices=["allgather", "alltoall"], help="MoE token dispatcher")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    model = load_spec(args.spec).model
    if args.experiment is not None:
        from alignflow.config import load_experiment

        model = load_experiment(args.experiment).model
    version = megatron_version()
    with model_parallel(args.device):
        gpt = build_gpt_model(model, device=args.device, dispatcher=args.dispatcher)
        try:
            report = load_into(gpt, args.checkpoint)
        except RuntimeError as exc:  # load_state_dict(strict=True): missing / unexpected keys, size mismatch
            report = {"ok": False, "error": str(exc)}
    report |= {"megatron_core": version, "mtp_inner_layer": mtp_inner_layer(version), "spec": args.spec,
               "device": args.device}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        status = "OK" if report["ok"] else "FAILED"
        print(f"{status}: {args.checkpoint} into megatron-core {version} GPTModel ({args.spec}, {args.device})")
        for key, value in report.items():
            print(f"  {key}: {value}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
