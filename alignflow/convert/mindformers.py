"""MindFormers checkpoints: open one for streaming (PyNative layout, multi-rank shards, legacy `.ckpt`) and the
names of the files a loadable MindFormers checkpoint must have.

Layout (docs/mindformers.md#checkpoint-layout): `<dir>/latest_checkpointed_iteration.txt` names `<dir>/iteration_%08d/`,
which holds `{prefix}-model-{rank:07d}-{world:07d}.safetensors` (+ `-opt-` files), `common.json` and, for several
ranks, `metadata.json`, whose chunks give each shard's `global_offset` in the full tensor. Opening a checkpoint
reads only headers and JSON; `read(name)` assembles one full tensor at a time.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from alignflow.convert.layout import COMMON_JSON, COMMON_KEYS, OPT_FILE, TRACKER, iteration_dir_name
from alignflow.convert.mindformers_strategy import (
    PARAM_NAME_MAP,
    chunks_by_strategy,
    find_strategy,
    is_rank_directory,
    rank_files,
    strategy_layouts,
    unified_map,
)
from alignflow.convert.tensor_io import SafetensorsFileError, TensorMeta, read_layout, read_tensor
from alignflow.errors import ConversionError

log = logging.getLogger(__name__)

METADATA_JSON = "metadata.json"
DEFAULT_PREFIX = "checkpoint"  # PyNative `CheckpointConfig.prefix` default

_MODEL_FILE = re.compile(r"^(?:(?P<prefix>.+)-)?model-(?P<rank>\d+)-(?P<world>\d+)\.safetensors$")
_ITERATION_DIR = re.compile(r"^iteration_(\d+)$")


def common_json(source: dict[str, Any] | None, iteration: int) -> tuple[dict[str, Any], list[str]]:
    """Exactly the 7 `CommonInfo` keys, values taken from `source` where it has them; plus notes on what changed."""
    defaults: dict[str, Any] = {"epoch_num": 0, "step_num": iteration, "global_step": iteration, "loss_scale": 1.0,
                                "global_batch_size": 1, "consumed_samples": 0, "ckpt_status": None}
    source = source or {}
    out = {key: source.get(key, defaults[key]) for key in COMMON_KEYS}
    if isinstance(out["loss_scale"], str):  # older MindFormers wrote "1.0"
        out["loss_scale"] = float(out["loss_scale"])
    notes = [f"common.json: {key} not in the source, wrote {defaults[key]!r}" for key in COMMON_KEYS
             if source and key not in source]
    notes += [f"common.json: dropped key {key!r} (MindFormers' CommonInfo rejects unknown keys)"
              for key in source if key not in COMMON_KEYS]
    return out, notes


@dataclass(frozen=True, slots=True)
class _Chunk:
    file: Path
    offset: tuple[int, ...]
    shape: tuple[int, ...]


class MindFormersCheckpoint:
    """A MindFormers checkpoint opened for streaming. Use as a context manager; `read` one tensor at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.iteration: int | None = None
        self.prefix: str | None = None
        self.common: dict[str, Any] | None = None
        self.tensors: dict[str, TensorMeta] = {}
        self.optimizer_keys: list[str] = []  # in optimizer files, never read
        self.files: list[Path] = []
        self._chunks: dict[str, tuple[_Chunk, ...]] = {}
        self._memory: dict[str, torch.Tensor] = {}  # legacy .ckpt only

    def __enter__(self) -> MindFormersCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._memory.clear()

    def read(self, name: str) -> torch.Tensor:
        """The full tensor `name` (shards merged at their global offsets); `ConversionError` if it cannot be read."""
        try:
            return self._read(name)
        except SafetensorsFileError as exc:
            raise ConversionError([str(exc)], header=f"cannot read the MindFormers checkpoint {self.path}") from None

    def _read(self, name: str) -> torch.Tensor:
        if name in self._memory:
            return self._memory[name]
        meta, chunks = self.tensors[name], self._chunks[name]
        if len(chunks) == 1 and chunks[0].shape == meta.shape:
            return read_tensor(chunks[0].file, name)
        full = torch.empty(meta.shape, dtype=meta.dtype)
        for chunk in chunks:
            part = read_tensor(chunk.file, name)
            full[tuple(slice(o, o + s) for o, s in zip(chunk.offset, chunk.shape, strict=True))] = part
        return full


def open_mindformers(src: Path, *, strategy: Path | None = None) -> MindFormersCheckpoint:
    """Open a tracker directory, an `iteration_*` directory, a `.safetensors` file, a legacy MindSpore `.ckpt`, a
    directory of per-rank `rank_*/` files sliced by a parallel strategy (`strategy`, or the one MindFormers saved
    beside them), or MindSpore's unified safetensors (`param_name_map.json`).

    Raises `ConversionError` listing every layout problem (missing iteration directory, duplicate tensors,
    shards that do not tile their tensor, files named in `metadata.json` that are not there).
    """
    src = Path(src)
    ckpt = MindFormersCheckpoint(src)
    if not src.exists():
        raise ConversionError([f"{src}: no such file or directory"], header="cannot open the MindFormers checkpoint")
    if src.is_dir() and (strategy is not None or is_rank_directory(src)):
        _index_by_strategy(ckpt, src, strategy)
        return ckpt
    if src.is_file():
        if src.suffix == ".ckpt":
            _load_legacy_ckpt(ckpt, src)
            return ckpt
        if src.suffix != ".safetensors":
            raise ConversionError([f"{src}: not a .safetensors or .ckpt file"],
                                  header="cannot open the MindFormers checkpoint")
        _index_files(ckpt, [src], None)
        return ckpt
    directory = _iteration_directory(src)
    match = _ITERATION_DIR.match(directory.name)
    ckpt.iteration = int(match.group(1)) if match else None
    common = directory / COMMON_JSON
    if common.is_file():
        try:
            ckpt.common = json.loads(common.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConversionError([f"{common}: malformed JSON ({exc})"],
                                  header="cannot open the MindFormers checkpoint") from None
    if ckpt.iteration is None and ckpt.common and isinstance(ckpt.common.get("global_step"), int):
        ckpt.iteration = ckpt.common["global_step"]
    files = sorted(directory.glob("*.safetensors"))
    ckpts = sorted(directory.glob("*.ckpt"))
    if not files and len(ckpts) == 1:
        _load_legacy_ckpt(ckpt, ckpts[0])
        return ckpt
    if not files:
        found = ", ".join(p.name for p in ckpts) if ckpts else "nothing"
        raise ConversionError([f"{directory}: no *.safetensors files (found {found}); pass one file explicitly"],
                              header="cannot open the MindFormers checkpoint")
    metadata = directory / METADATA_JSON
    _index_files(ckpt, files, metadata if metadata.is_file() else None)
    _check_unified_map(ckpt, directory)
    return ckpt


def _index_by_strategy(ckpt: MindFormersCheckpoint, src: Path, strategy: Path | None) -> None:
    """Per-rank files and their strategy (`alignflow.convert.mindformers_strategy`): one chunk per slice."""
    import tempfile

    header = f"cannot open the MindFormers checkpoint {src}"
    problems: list[str] = []
    files = rank_files(src, problems)
    strategies = [Path(strategy)] if strategy is not None else find_strategy(src)
    if not strategies:
        problems.append(f"{src}: per-rank files without a strategy file (none in strategy/ beside them): pass "
                        "--strategy FILE (MindFormers saves it as strategy/ckpt_strategy_rank_0.ckpt)")
    elif not all(p.is_file() for p in strategies):
        problems.append(f"{strategies[0]}: no such strategy file")
    if problems:
        raise ConversionError(problems, header=header)
    layouts_by_file = {f: _layout(f, problems) for f in files.values()}
    if problems:
        raise ConversionError(problems, header=header)
    with tempfile.TemporaryDirectory(prefix="alignflow-strategy-") as scratch:
        layouts = strategy_layouts(strategies, Path(scratch))
    merged = chunks_by_strategy(files, layouts_by_file, layouts, problems)
    for name, (meta, chunks) in merged.items():
        ckpt.tensors[name] = meta
        ckpt._chunks[name] = tuple(_Chunk(f, off, shape) for f, off, shape in chunks)
        problems += _tiling_problems(name, meta.shape, list(ckpt._chunks[name]))
    if problems:
        raise ConversionError(problems, header=header)
    ckpt.files = list(files.values())
    log.info("%s: %d ranks merged by the strategy %s", src, len(files), ", ".join(p.name for p in strategies))


def _check_unified_map(ckpt: MindFormersCheckpoint, directory: Path) -> None:
    """MindSpore's unified safetensors: every parameter where `param_name_map.json` says it is."""
    problems: list[str] = []
    weight_map = unified_map(directory, problems)
    if weight_map is None and not problems:
        return
    for name, file in sorted((weight_map or {}).items()):
        chunks = ckpt._chunks.get(name)
        if chunks is None:
            problems.append(f"{name}: in {PARAM_NAME_MAP} ({file}) but in none of the files")
        elif chunks[0].file.name != file:
            problems.append(f"{name}: {PARAM_NAME_MAP} names {file}, it is in {chunks[0].file.name}")
    if problems:
        raise ConversionError(problems, header=f"cannot open the MindFormers checkpoint {directory}")


def _iteration_directory(src: Path) -> Path:
    tracker = src / TRACKER
    if not tracker.is_file():
        return src
    text = tracker.read_text(encoding="utf-8").strip()
    if not text.isdigit():
        raise ConversionError([f"{tracker}: expected an iteration number, found {text[:40]!r}"],
                              header="cannot open the MindFormers checkpoint")
    directory = src / iteration_dir_name(int(text))
    if not directory.is_dir():
        raise ConversionError([f"{tracker} names iteration {text}, but {directory.name}/ does not exist"],
                              header="cannot open the MindFormers checkpoint")
    return directory


def _index_files(ckpt: MindFormersCheckpoint, files: list[Path], metadata: Path | None) -> None:
    problems: list[str] = []
    model_files = [f for f in files if not OPT_FILE.match(f.name)]
    ckpt.files = model_files
    for f in files:
        if OPT_FILE.match(f.name):
            ckpt.optimizer_keys += list(_layout(f, problems))
    prefixes = {m.group("prefix") for f in model_files if (m := _MODEL_FILE.match(f.name))}
    ckpt.prefix = prefixes.pop() if len(prefixes) == 1 else None
    layouts = {f: _layout(f, problems) for f in model_files}
    if metadata is not None:
        _index_with_metadata(ckpt, layouts, metadata, problems)
    else:
        for f, layout in layouts.items():
            for name, meta in layout.items():
                if name in ckpt.tensors:
                    first = ckpt._chunks[name][0].file.name
                    problems.append(f"{name}: in both {first} and {f.name} and there is no metadata.json to merge "
                                    "them (MindFormers raises 'Duplicate parameter_name found')")
                    continue
                ckpt.tensors[name] = meta
                ckpt._chunks[name] = (_Chunk(f, (0,) * len(meta.shape), meta.shape),)
    if problems:
        raise ConversionError(problems, header=f"cannot open the MindFormers checkpoint {ckpt.path}")


def _layout(f: Path, problems: list[str]) -> dict[str, TensorMeta]:
    try:
        return read_layout(f)
    except SafetensorsFileError as exc:
        problems.append(str(exc))
    except OSError as exc:
        problems.append(f"{f}: cannot read: {exc.strerror or exc}")
    return {}


def _index_with_metadata(ckpt: MindFormersCheckpoint, layouts: dict[Path, dict[str, TensorMeta]], metadata: Path,
                         problems: list[str]) -> None:
    """Build each tensor from the chunks of `metadata.json` (docs/mindformers.md#metadatajson): shard id
    `str((name, offset))`."""
    try:
        meta = json.loads(metadata.read_text(encoding="utf-8"))
        params: dict[str, Any] = meta["state_dict_metadata"]
        storage: dict[str, Any] = meta["storage_data"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        problems.append(f"{metadata}: not a MindFormers metadata.json ({exc!r})")
        return
    by_name = {f.name: f for f in layouts}
    described: set[str] = set()
    for name, entry in params.items():
        global_shape = tuple(int(s) for s in entry["global_shape"])
        chunks: list[_Chunk] = []
        seen_offsets: set[tuple[int, ...]] = set()
        skip = False
        for raw in entry["chunk"]:
            offset = tuple(int(o) for o in raw["global_offset"])
            if offset in seen_offsets:  # a replica of a chunk already placed
                continue
            seen_offsets.add(offset)
            stored = storage.get(str((name, offset)), [])
            file_names = [s["file_name"] for s in stored]
            if file_names and all(OPT_FILE.match(n) for n in file_names):
                skip = True  # optimizer state, listed from the optimizer files' headers
                break
            present = [by_name[n] for n in file_names if n in by_name]
            if not present:
                problems.append(f"{name}: chunk at offset {list(offset)} is stored in {file_names or 'no file'}, "
                                f"which is not in {metadata.parent}")
                continue
            shape = tuple(int(s) for s in raw["local_shape"])
            file_meta = layouts[present[0]].get(name)
            if file_meta is None or file_meta.shape != shape:
                got = "absent" if file_meta is None else str(list(file_meta.shape))
                problems.append(f"{name}: metadata.json puts a {list(shape)} chunk in {present[0].name}, the file has "
                                f"{got}")
                continue
            chunks.append(_Chunk(present[0], offset, shape))
        if skip:
            continue
        described.add(name)
        problems += _tiling_problems(name, global_shape, chunks)
        dtypes = {layouts[c.file][name].dtype for c in chunks}
        if len(dtypes) > 1:
            problems.append(f"{name}: shards have different dtypes {sorted(str(d) for d in dtypes)}")
        if chunks:
            ckpt.tensors[name] = TensorMeta(global_shape, layouts[chunks[0].file][name].dtype)
            ckpt._chunks[name] = tuple(chunks)
    for f, layout in layouts.items():
        for name in layout:
            if name not in described and name not in ckpt.tensors:
                problems.append(f"{name}: in {f.name} but not described by metadata.json")


def _tiling_problems(name: str, global_shape: tuple[int, ...], chunks: list[_Chunk]) -> list[str]:
    """Chunks must lie inside the tensor, not overlap, and cover it (volumes add up)."""
    out = []
    for c in chunks:
        if len(c.offset) != len(global_shape) or any(o + s > g for o, s, g in zip(c.offset, c.shape, global_shape,
                                                                                    strict=True)):
            out.append(f"{name}: chunk at {list(c.offset)} of shape {list(c.shape)} lies outside {list(global_shape)}")
    for i, a in enumerate(chunks):
        for b in chunks[i + 1 :]:
            if all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a.offset, a.shape, b.offset, b.shape,
                                                                                strict=False)):
                out.append(f"{name}: chunks at {list(a.offset)} and {list(b.offset)} overlap")
    if not out and sum(math.prod(c.shape) for c in chunks) != math.prod(global_shape):
        out.append(f"{name}: shards cover {sum(math.prod(c.shape) for c in chunks)} of "
                   f"{math.prod(global_shape)} elements of {list(global_shape)}")
    return out


def _load_legacy_ckpt(ckpt: MindFormersCheckpoint, path: Path) -> None:
    """A graph-mode `.ckpt` (docs/mindformers.md#legacy-graph-checkpoint) through MindSpore; it loads whole, so this
    path does not stream."""
    try:
        import mindspore
        import numpy as np
    except ImportError:
        raise ConversionError([f"{path}: reading a MindSpore .ckpt needs MindSpore (pip install mindspore); or "
                               "save the checkpoint as safetensors"], header="cannot open the checkpoint") from None
    log.info("loading %s through MindSpore (legacy .ckpt: read whole, not streamed)", path)
    try:
        params = mindspore.load_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError) as exc:
        raise ConversionError([f"{path}: MindSpore cannot load it ({exc})"],
                              header="cannot open the checkpoint") from None
    for name, param in params.items():
        array = param.asnumpy()
        if array.dtype.name == "bfloat16":  # ml_dtypes bfloat16: reinterpret the bits, no value conversion
            tensor = torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(np.ascontiguousarray(array))
        ckpt._memory[name] = tensor
        ckpt.tensors[name] = TensorMeta(tuple(tensor.shape), tensor.dtype)
    ckpt.files = [path]
