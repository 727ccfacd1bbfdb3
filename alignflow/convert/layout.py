"""Checkpoint layouts and megatron-core versions as pure data: names, constants, parsers. Imports no torch.

Shared by the converter (`megatron`, `mindformers`, `plan`) and the twins (the MindSpore twin runs
without torch), and by preflight: one parser of megatron-core versions, one set of file names per layout.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from alignflow.config.parallel import ParallelConfig
from alignflow.frameworks.megatron_versions import MegatronVersionError as MegatronVersionError
from alignflow.frameworks.megatron_versions import parse_version as parse_version

TRACKER = "latest_checkpointed_iteration.txt"  # both layouts: names the iteration (or `release`, Megatron)

# Megatron legacy (`--ckpt-format torch`, docs/megatron.md#legacy-checkpoint-layout).
# what megatron-core writes; a missing version triggers a legacy QKV "fix"
# (docs/megatron.md#what-the-loader-needs-under-finetune)
CHECKPOINT_VERSION = 3.0
MEGATRON_FILE_NAME = "model_optim_rng.pt"

# MindFormers PyNative (docs/mindformers.md#checkpoint-layout).
COMMON_JSON = "common.json"
# The 7 keys of `CommonInfo`, in its field order; `load_common` raises TypeError on any other key
# (docs/mindformers.md#commonjson).
COMMON_KEYS = ("epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size", "consumed_samples",
               "ckpt_status")
OPT_FILE = re.compile(r"^(?:.+-)?opt-\d+-\d+\.safetensors$")


def checkpoint_path(iteration: int | None) -> str:
    """Relative path of the rank-0 file: `iter_{N:07d}/mp_rank_00/model_optim_rng.pt`, or `release/...`."""
    folder = "release" if iteration is None else f"iter_{iteration:07d}"
    return f"{folder}/mp_rank_00/{MEGATRON_FILE_NAME}"


def iteration_dir_name(iteration: int) -> str:
    return f"iteration_{iteration:08d}"


def shard_file_name(prefix: str | None, kind: str, rank: int = 0, world: int = 1) -> str:
    """`[{prefix}-]{kind}-{rank:07d}-{world:07d}.safetensors` (`kind` is `model` or `opt`)."""
    stem = f"{kind}-{rank:07d}-{world:07d}.safetensors"
    return f"{prefix}-{stem}" if prefix else stem


def model_file_name(prefix: str, rank: int = 0, world: int = 1) -> str:
    """`{prefix}-model-{rank:07d}-{world:07d}.safetensors`; never `model.safetensors`, which MindFormers would take
    for a Hugging Face directory and load through its HF template path
    (docs/mindformers.md#loading-a-checkpoint-for-training)."""
    return shard_file_name(prefix, "model", rank, world)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename (a tracker is never seen half-written)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; a tracker is as readable as the checkpoint it names
    os.replace(tmp, path)


# megatron-core renamed the MTP inner layer in core_v0.17.0 (docs/megatron.md#mtp-layers): first version -> name.
MTP_INNER_LAYER: tuple[tuple[tuple[int, int], str], ...] = (((0, 17), "mtp_model_layer"), ((0, 0), "transformer_layer"))
def mtp_inner_layer(version: str) -> str:
    """The name of the MTP block's inner transformer layer in megatron-core `version`."""
    v = parse_version(version)
    return next(name for first, name in MTP_INNER_LAYER if v >= first)


def megatron_checkpoint_layout(conversion_format: str, gpu: ParallelConfig) -> tuple[str, ParallelConfig]:
    """The Megatron checkpoint a GPU training of layout `gpu` is given: its `--ckpt-format` and the tp / pp / ep its
    files are written for (`conversion.format`: auto = a single legacy file for one rank, torch_dist otherwise;
    torch = legacy files for exactly the training's ranks; torch_dist = one checkpoint for any layout)."""
    single = (gpu.tp, gpu.pp, gpu.ep) == (1, 1, 1)
    fmt = ("torch" if single else "torch_dist") if conversion_format == "auto" else conversion_format
    if fmt == "torch_dist":
        return fmt, ParallelConfig()
    return fmt, ParallelConfig(tp=gpu.tp, pp=gpu.pp, ep=gpu.ep, dp=gpu.ep)


def checkpoint_load_problems(checkpoint: tuple[str, ParallelConfig], training: tuple[str, ParallelConfig]) -> list[str]:
    """Why a Megatron training (its `--ckpt-format` and layout) cannot load a checkpoint (its format and the layout
    its files are for): the format must be the one it asks for (Megatron-LM builds a sharded state dict only for
    `--ckpt-format torch_dist`: "Detected load from a distributed checkpoint, but neither --use-dist-ckpt nor
    --auto-detect-ckpt-format is set"; a torch-format run opens `mp_rank_*` files), and legacy files load only at
    the tp / pp / ep they were written for (`get_checkpoint_name` names this rank's file from the run's own
    ranks). torch_dist loads at any layout megatron-core can build (`sharding.layout_problems`)."""
    (c_fmt, c_par), (t_fmt, t_par) = checkpoint, training
    if c_fmt != t_fmt:
        return [f"the checkpoint is {c_fmt}, the training loads --ckpt-format {t_fmt}"]
    if c_fmt == "torch" and (c_par.tp, c_par.pp, c_par.ep) != (t_par.tp, t_par.pp, t_par.ep):
        return [f"legacy files for tp {c_par.tp} pp {c_par.pp} ep {c_par.ep}, the training runs tp {t_par.tp} pp "
                f"{t_par.pp} ep {t_par.ep}: a legacy checkpoint loads only at its own layout (use torch_dist)"]
    return []
