"""Megatron legacy (`--ckpt-format torch`) checkpoints: write one, open one for reading.

Layout (docs/megatron.md#legacy-checkpoint-layout): `<dir>/latest_checkpointed_iteration.txt` holds N (or `release`),
and `<dir>/iter_{N:07d}/mp_rank_00/model_optim_rng.pt` is `{'model': state_dict, 'checkpoint_version': 3.0,
'iteration': N}`: only tensors, None and Python primitives, so that `torch.load(weights_only=True)` (the torch
>= 2.6 default that Megatron relies on) accepts it. Only TP = PP = EP = 1 (one `mp_rank_00` file) is handled:
the alignment runs are single-card, and a sharded file holds module-local names that a spec cannot check.
"""

from __future__ import annotations

import logging
import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from alignflow.convert.layout import CHECKPOINT_VERSION, MEGATRON_FILE_NAME, TRACKER, checkpoint_path
from alignflow.convert.tensor_io import TensorMeta
from alignflow.errors import ConversionError

log = logging.getLogger(__name__)

FILE_NAME = MEGATRON_FILE_NAME


def write_megatron(directory: Path, state_dict: Mapping[str, torch.Tensor | None], iteration: int) -> list[str]:
    """Write the legacy checkpoint into `directory`; return the files written (relative)."""
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    rel = checkpoint_path(iteration)
    path = directory / rel
    path.parent.mkdir(parents=True)
    for key, value in state_dict.items():
        assert value is None or isinstance(value, torch.Tensor), f"{key}: {type(value).__name__} in a state dict"
    torch.save({"model": dict(state_dict), "checkpoint_version": CHECKPOINT_VERSION, "iteration": int(iteration)},
               path)
    (directory / TRACKER).write_text(str(iteration), encoding="utf-8")
    _verify_weights_only(path, state_dict)
    return [TRACKER, rel]


def _verify_weights_only(path: Path, state_dict: Mapping[str, torch.Tensor | None]) -> None:
    """Reload with `weights_only=True` (lazily, mmap) and compare the key set: what Megatron will do first."""
    loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if set(loaded["model"]) != set(state_dict):
        raise ConversionError([f"{path}: reloading gives a different key set"], header="Megatron checkpoint invalid")


class MegatronCheckpoint:
    """A legacy Megatron checkpoint opened for reading: tensors are memory-mapped, read one at a time."""

    def __init__(self, path: Path, payload: dict[str, Any], file: Path) -> None:
        self.path = path
        self.file = file
        model = payload["model"]
        self.iteration: int = int(payload.get("iteration", 0))
        self.checkpoint_version = payload.get("checkpoint_version")
        self.tensors: dict[str, TensorMeta] = {}
        self.others: dict[str, Any] = {}  # `_extra_state` placeholders and anything else that is not a tensor
        self._model: dict[str, Any] = model
        for key, value in model.items():
            if isinstance(value, torch.Tensor):
                self.tensors[key] = TensorMeta(tuple(value.shape), value.dtype)
            else:
                self.others[key] = value

    def read(self, name: str) -> torch.Tensor:
        tensor: torch.Tensor = self._model[name]
        return tensor

    def close(self) -> None:
        self._model = {}

    def __enter__(self) -> MegatronCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_megatron(src: Path) -> MegatronCheckpoint:
    """Open a checkpoint directory (tracker), an `iter_*`/`release` directory, or a `model_optim_rng.pt` file."""
    src = Path(src)
    header = "cannot open the Megatron checkpoint"
    file = _resolve_file(src, header)
    try:
        payload = _load(file)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as exc:
        raise ConversionError([f"{file}: torch.load(weights_only=True) failed: {exc}"], header=header) from None
    if not isinstance(payload, dict) or "model" not in payload:
        keys = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        detail = "; virtual-pipeline files (model0, model1, ...) are not supported" if "model0" in str(keys) else ""
        raise ConversionError([f"{file}: no 'model' state dict (found {keys}){detail}"], header=header)
    problems = args_problems(payload, file)
    if problems:
        raise ConversionError(problems, header=header)
    return MegatronCheckpoint(src, payload, file)


def args_problems(payload: dict[str, Any], file: Path) -> list[str]:
    """Where the `args` Megatron saved with a one-rank checkpoint contradict its tensors (the layers it says it has,
    its hidden size): Megatron builds the model from them (issue 45: a contradicting config converted silently)."""
    args = payload.get("args")
    model = payload["model"]
    layers = {int(k.split(".")[2]) for k in model if k.startswith("decoder.layers.") and k.split(".")[2].isdigit()}
    embedding = model.get("embedding.word_embeddings.weight")
    problems = []
    num_layers, hidden = getattr(args, "num_layers", None), getattr(args, "hidden_size", None)
    one_stage = getattr(args, "pipeline_model_parallel_size", 1) in (None, 1)  # a stage file holds its own layers
    if isinstance(num_layers, int) and one_stage and layers and num_layers != len(layers):
        problems.append(f"{file}: its args say num_layers {num_layers}, its tensors hold {len(layers)} layers "
                        f"(decoder.layers.0-{max(layers)})")
    if isinstance(hidden, int) and isinstance(embedding, torch.Tensor) and embedding.dim() == 2 \
            and embedding.shape[1] != hidden:
        problems.append(f"{file}: its args say hidden_size {hidden}, its embedding.word_embeddings.weight is "
                        f"{list(embedding.shape)}")
    return problems


def _resolve_file(src: Path, header: str) -> Path:
    if src.is_file():
        return src
    directory = src
    tracker = src / TRACKER
    if tracker.is_file():
        text = tracker.read_text(encoding="utf-8").strip()
        if text == "release":
            directory = src / "release"
        elif text.isdigit():
            directory = src / f"iter_{int(text):07d}"
        else:
            raise ConversionError([f"{tracker}: expected an iteration number or 'release', found {text[:40]!r}"],
                                  header=header)
    shards = sorted(p.name for p in directory.glob("mp_rank_*")) if directory.is_dir() else []
    if not shards and (directory / ".metadata").is_file():  # a torch_dist directory that lost its metadata.json
        raise ConversionError([f"{directory / 'metadata.json'}: missing (the directory holds a distributed "
                               "checkpoint's .metadata, and no mp_rank_* directory)"], header=header)
    if not shards:
        raise ConversionError([f"{directory}: no mp_rank_* directory (expected {checkpoint_path(0)} under a "
                               "checkpoint directory)"], header=header)
    if shards != ["mp_rank_00"]:
        raise ConversionError([f"{directory}: shards {shards}; only TP = PP = EP = 1 (mp_rank_00 alone) is "
                               "supported; reshard with Megatron's tools/checkpoint first"], header=header)
    file = directory / "mp_rank_00" / FILE_NAME
    if not file.is_file():
        raise ConversionError([f"{file}: missing"], header=header)
    return file


def _load(file: Path) -> Any:
    """`torch.load(weights_only=True)`; Megatron's own files pickle `args` (an argparse Namespace with Megatron
    enums), which only loads after `import megatron.core` registers its safe globals
    (docs/megatron.md#weights_only-loading)."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        try:
            with warnings.catch_warnings():  # its import chain warns about TE/Apex and torch.jit deprecations
                warnings.simplefilter("ignore")
                import megatron.core  # noqa: F401 - registers Megatron's weights_only safe globals
        except ImportError:
            raise
        log.info("%s: retrying torch.load after importing megatron.core for its safe globals", file)
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
