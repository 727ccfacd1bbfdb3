"""Synthetic checkpoints of a spec's documented shapes, written with the real safetensors library."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from alignflow.config.model import ModelConfig
from alignflow.convert import build_plan, load_spec
from alignflow.convert.spec import Spec

COMMON = {"epoch_num": 1, "step_num": 10, "global_step": 10, "loss_scale": 1.0, "global_batch_size": 4,
          "consumed_samples": 40, "ckpt_status": None}


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Finite random values of `dtype` (bf16 from random fp32 normals; every bit pattern class of a weight)."""
    return (torch.randn(shape, generator=g) * 0.05).to(dtype)


def source_state(spec: str | Spec, model: ModelConfig | None = None, *, flavor: str = "local",
                 dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> dict[str, torch.Tensor]:
    """MindFormers tensors of every source key of `spec` for `model`; fp32 where the spec requires it."""
    spec = load_spec(spec) if isinstance(spec, str) else spec
    plan = build_plan(spec, model, flavor=flavor)  # type: ignore[arg-type]
    assert not plan.problems, plan.problems
    g = torch.Generator().manual_seed(seed)
    out = {}
    for m in plan.mappings:
        for key, shape in zip(m.sources, m.source_shapes, strict=True):
            out[key] = random_bits(shape, torch.float32 if m.dtype == "float32" else dtype, g)
    return out


def write_mindformers(root: Path, tensors: dict[str, torch.Tensor], *, iteration: int = 10,
                      prefix: str = "checkpoint", common: dict | None = COMMON,
                      optimizer: dict[str, torch.Tensor] | None = None) -> Path:
    """A PyNative checkpoint directory: tracker + iteration_%08d/<prefix>-model-0000000-0000001.safetensors."""
    it_dir = root / f"iteration_{iteration:08d}"
    it_dir.mkdir(parents=True)
    save_file(tensors, str(it_dir / f"{prefix}-model-0000000-0000001.safetensors"))
    if optimizer is not None:
        save_file(optimizer, str(it_dir / f"{prefix}-opt-0000000-0000001.safetensors"))
    if common is not None:
        (it_dir / "common.json").write_text(json.dumps(common, indent=4))
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return root


def read_mindformers(root: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a single-file MindFormers checkpoint directory (via its tracker)."""
    iteration = int((root / "latest_checkpointed_iteration.txt").read_text())
    (file,) = (root / f"iteration_{iteration:08d}").glob("*-model-*.safetensors")
    return load_file(str(file))


def read_megatron(root: Path) -> dict:
    iteration = int((root / "latest_checkpointed_iteration.txt").read_text())
    return torch.load(root / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.pt", weights_only=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits (NaN-safe, -0.0-safe comparison)."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.uint8}
    return t.contiguous().view(ints[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def leftovers(parent: Path) -> list[str]:
    """Staged output directories a failed conversion must not leave behind."""
    return sorted(p.name for p in parent.iterdir() if p.name.endswith(".partial"))
