"""MindFormers PyNative ("Checkpoint 2.0") checkpoints for the MindSpore twin: write, find, read.

Layout (docs/mindformers.md#checkpoint-layout, docs/mindformers.md#commonjson):
`<save_path>/iteration_%08d/<prefix>-model-%07d-%07d.safetensors` (rank, world
size), the optimizer file `<prefix>-opt-...` unless `no_save_optim`, `common.json` with exactly the seven
`CommonInfo` keys in MindFormers' order, and `<save_path>/latest_checkpointed_iteration.txt` written last. Files
are written by `mindspore.save_checkpoint(..., format="safetensors")`.

Loading follows MindFormers' `load_checkpoint` (docs/mindformers.md#loading-a-checkpoint-for-training): a directory with
a tracker descends into its iteration, an
iteration directory is used as is; `common.json` is read first and must have exactly the seven keys; every
`*.safetensors` that is not an optimizer file is a model file, each tensor a full tensor at offset 0 (no
`metadata.json`); a name in two files is an error (`Duplicate parameter_name found`).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mindspore as ms

from alignflow.convert.layout import (
    COMMON_JSON,
    COMMON_KEYS,
    OPT_FILE,
    TRACKER,
    iteration_dir_name,
    shard_file_name,
    write_atomic,
)
from alignflow.errors import ConfigError

_ITERATION_DIR = re.compile(r"^iteration_(\d{8})$")


def iteration_dir(save_path: Path, iteration: int) -> Path:
    return save_path / iteration_dir_name(iteration)


def common_info(*, step_num: int, global_step: int, global_batch_size: int, consumed_samples: int
                ) -> dict[str, Any]:
    """`CommonInfo.__dict__` in field order (PyNative sets `step_num` from `max_steps`)."""
    return {"epoch_num": 1, "step_num": step_num, "global_step": global_step, "loss_scale": 1.0,
            "global_batch_size": global_batch_size, "consumed_samples": consumed_samples, "ckpt_status": None}


def global_step_tensor(step: int) -> dict[str, Any]:
    """The optimizer file's `global_step`: int64 `[1]`, as MindFormers 2.1.0 writes it."""
    import numpy as np

    return {"name": "global_step", "data": ms.Tensor(np.array([step], np.int64))}


def save(
    save_path: Path,
    iteration: int,
    *,
    prefix: str | None,
    model: list[dict[str, Any]],
    optimizer: list[dict[str, Any]] | None,
    common: dict[str, Any],
    save_max: int,
    saved_by_this_run: list[Path],
) -> Path:
    """Write one checkpoint, then the tracker; prune this run's oldest checkpoints beyond `save_max`."""
    target = iteration_dir(save_path, iteration)
    target.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(model, str(target / shard_file_name(prefix, "model")), format="safetensors")
    if optimizer is not None:
        ms.save_checkpoint(optimizer, str(target / shard_file_name(prefix, "opt")), format="safetensors")
    (target / COMMON_JSON).write_text(json.dumps(common, indent=4))
    write_atomic(save_path / TRACKER, str(iteration))
    if target not in saved_by_this_run:
        saved_by_this_run.append(target)
    while len(saved_by_this_run) > save_max:
        shutil.rmtree(saved_by_this_run.pop(0), ignore_errors=True)
    return target


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    directory: Path
    common: dict[str, Any]
    tensors: dict[str, Any]  # name -> mindspore Parameter (any dtype)
    optimizer: dict[str, Any] | None


def resolve(load_path: Path, *, where: str) -> Path:
    """The iteration directory `load_path` designates (tracker dir or iteration dir)."""
    if not load_path.exists():
        raise ConfigError(f"{where}: checkpoint.load_path {str(load_path)!r} does not exist; the twin never "
                          "falls back to a random initialisation (MindFormers would)")
    if not load_path.is_dir():
        raise ConfigError(f"{where}: checkpoint.load_path {str(load_path)!r} is not a directory")
    tracker = load_path / TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        if not text.isdigit():
            raise ConfigError(f"{where}: {str(tracker)!r} holds {text!r}, not an iteration number")
        return iteration_dir(load_path, int(text))
    if any(load_path.glob("*.safetensors")):
        return load_path
    if (load_path / "model.safetensors").exists() or any(load_path.glob("*model.safetensors.index.json")):
        raise ConfigError(f"{where}: {str(load_path)!r} is a Hugging Face checkpoint; the twin loads MindFormers "
                          "checkpoints only")
    raise ConfigError(f"{where}: checkpoint.load_path {str(load_path)!r} has neither {TRACKER} nor *.safetensors "
                      "files (empty checkpoint directory)")


def load(load_path: Path, *, need_optimizer: bool, where: str) -> LoadedCheckpoint:
    directory = resolve(load_path, where=where)
    if not directory.is_dir():
        raise ConfigError(f"{where}: the tracker names {directory.name}, but {str(directory)!r} does not exist")
    common_path = directory / COMMON_JSON
    if not common_path.is_file():
        raise ConfigError(f"{where}: Can not find 'common.json' file at: '{common_path}'")
    try:
        common = json.loads(common_path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: {str(common_path)!r} is not JSON: {exc}") from None
    extra = sorted(set(common) - {*COMMON_KEYS, "data_plan_state"}) if isinstance(common, dict) else ["<not a dict>"]
    if extra:
        raise ConfigError(f"{where}: {str(common_path)!r} has keys MindFormers' CommonInfo rejects: {extra}")
    tensors: dict[str, Any] = {}
    optimizer: dict[str, Any] | None = None
    files = sorted(directory.glob("*.safetensors"))
    for path in files:
        if OPT_FILE.match(path.name):
            if need_optimizer:
                optimizer = dict(ms.load_checkpoint(str(path), format="safetensors"))
            continue
        for name, value in ms.load_checkpoint(str(path), format="safetensors").items():
            if name in tensors:
                raise ConfigError(f"{where}: Duplicate parameter_name found: {name} (in {path.name} and another file)")
            tensors[name] = value
    if not tensors:
        raise ConfigError(f"{where}: {str(directory)!r} holds no model *.safetensors file")
    if need_optimizer and optimizer is None:
        raise ConfigError(f"{where}: no_load_optim is False but no optimizer checkpoint found in {str(directory)!r}; "
                          "set checkpoint.no_load_optim: True to load the weights only")
    return LoadedCheckpoint(directory, common, tensors, optimizer)


def latest_iteration_dirs(save_path: Path) -> list[Path]:
    return sorted(p for p in save_path.iterdir() if _ITERATION_DIR.match(p.name)) if save_path.is_dir() else []

