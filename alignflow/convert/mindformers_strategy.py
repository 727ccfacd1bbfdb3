"""MindFormers distributed checkpoints: per-rank files sliced by a MindSpore parallel strategy, and the unified
safetensors MindSpore merges them into (docs/mindformers.md#distributed-checkpoints).

- **Per-rank, with a strategy file** (MindFormers' auto-parallel trainer: `checkpoint/rank_{r}/{prefix}_rank_{r}-
  {epoch}_{step}.safetensors`, `strategy/ckpt_strategy_rank_{r}.ckpt`): each rank holds its slice of each
  parameter; the strategy (`node_strategy.proto`'s `ParallelStrategyMap`, or its JSON form) gives each parameter's
  device matrix and tensor map. The strategy is read with MindSpore's own `build_searched_strategy`, and where each
  rank's slice lies in the full tensor is MindSpore's own arithmetic (`_get_tensor_strategy`,
  `_get_tensor_slice_index`, what `merge_sliced_parameter` and `unified_safetensors` use). The result is an index of
  chunks, so a tensor is assembled when it is read, one at a time, from one copy of each slice (streaming: the
  replicas are never read).
- **Unified safetensors** (`mindspore.unified_safetensors`: `part{N}.safetensors`, `param_name_map.json`'s
  `weight_map`, `hyper_param.safetensors` for what the strategy does not cover): whole tensors in several files.

Refused, with what to do: the optimizer's weight sharding (`opt_weight_shard_size` > 1: MindSpore's own merge then
takes each file to hold 1/size of its model-parallel slice), uneven splits (`param_split_shape`), `field` layouts,
and per-rank `.ckpt` files (which MindSpore loads whole: `mindspore.ckpt_to_safetensors` them first).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from alignflow.convert.tensor_io import TensorMeta
from alignflow.errors import ConversionError

PARAM_NAME_MAP = "param_name_map.json"
_RANK_DIR = re.compile(r"^rank_(\d+)$")
_STEP = re.compile(r"-(\d+)_(\d+)\.safetensors$")


def is_rank_directory(src: Path) -> bool:
    return src.is_dir() and any(_RANK_DIR.match(p.name) and p.is_dir() for p in src.iterdir())


def rank_files(src: Path, problems: list[str]) -> dict[int, Path]:
    """The model file of each `rank_{r}/` (the latest `-{epoch}_{step}` where a rank kept several)."""
    out: dict[int, Path] = {}
    for d in sorted(src.iterdir()):
        m = _RANK_DIR.match(d.name)
        if not (m and d.is_dir()):
            continue
        files = sorted(d.glob("*.safetensors"))
        if not files:
            found = ", ".join(p.name for p in d.glob("*.ckpt")) or "nothing"
            problems.append(f"{d}: no .safetensors file (found {found}); MindSpore loads a .ckpt whole - convert "
                            "the ranks' files with mindspore.ckpt_to_safetensors first")
            continue

        def step(p: Path) -> tuple[int, int]:
            s = _STEP.search(p.name)
            return (int(s.group(1)), int(s.group(2))) if s else (-1, -1)

        out[int(m.group(1))] = max(files, key=step)
    return out


def find_strategy(src: Path) -> list[Path]:
    """Strategy files next to a per-rank checkpoint: `<src>/strategy/`, `<src>/../strategy/` (MindFormers' output
    layout), or `<src>/*strategy*.ckpt|json`."""
    for d in (src / "strategy", src.parent / "strategy"):
        files = sorted([*d.glob("*.ckpt"), *d.glob("*.json")]) if d.is_dir() else []
        if files:
            return files
    return sorted(p for p in src.iterdir() if "strategy" in p.name and p.suffix in (".ckpt", ".json"))


def _mindspore() -> Any:
    try:
        import mindspore
        from mindspore.parallel import _parallel_serialization, _tensor  # noqa: F401 - MindSpore's own slicing
    except ImportError as exc:
        raise ConversionError([f"reading a checkpoint sliced by a MindSpore parallel strategy needs MindSpore "
                               f"({exc}): pip install mindspore"], header="MindSpore needed") from None
    return mindspore


def strategy_layouts(strategy_files: list[Path], scratch: Path) -> dict[str, list[Any]]:
    """Parameter -> `[dev_matrix, tensor_map, param_split_shape, field, shard_step, shard_size, stages]`, read by
    MindSpore (several stage files are merged first with `mindspore.merge_pipeline_strategys`)."""
    ms = _mindspore()
    from mindspore.parallel._parallel_serialization import _convert_to_list

    if len(strategy_files) == 1:
        path = strategy_files[0]
    else:
        stage_dir = scratch / "stages"
        stage_dir.mkdir(parents=True, exist_ok=True)
        for f in strategy_files:
            (stage_dir / f.name).write_bytes(f.read_bytes())
        path = scratch / "merged_strategy.ckpt"
        ms.merge_pipeline_strategys(str(stage_dir), str(path))
    try:
        layouts: dict[str, list[Any]] = _convert_to_list(ms.build_searched_strategy(str(path)))
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ConversionError([f"{path}: MindSpore cannot read it as a parallel strategy ({exc})"],
                              header="cannot read the strategy file") from None
    return layouts


def slice_offset(dev_matrix: list[int], tensor_map: list[Any], local_rank: int, slice_shape: tuple[int, ...]
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offset of `local_rank`'s slice in the full tensor, the number of slices per dimension)."""
    from mindspore.parallel._tensor import _get_tensor_slice_index, _get_tensor_strategy

    strategy = [int(s) for s in _get_tensor_strategy(dev_matrix, tensor_map)]
    index = int(_get_tensor_slice_index(dev_matrix, strategy, tensor_map, local_rank))
    coords = [0] * len(strategy)
    for i in range(len(strategy) - 1, -1, -1):  # `_coordinate_to_rank`: the last dimension varies fastest
        coords[i] = index % strategy[i]
        index //= strategy[i]
    return tuple(c * s for c, s in zip(coords, slice_shape, strict=True)), tuple(strategy)


def chunks_by_strategy(files: Mapping[int, Path], file_layouts: Mapping[Path, Mapping[str, TensorMeta]],
                       layouts: Mapping[str, list[Any]], problems: list[str]
                       ) -> dict[str, tuple[TensorMeta, list[tuple[Path, tuple[int, ...], tuple[int, ...]]]]]:
    """Each parameter's full shape and dtype, and one `(file, offset, shape)` per distinct slice; what cannot be
    merged is appended to `problems`."""
    out: dict[str, tuple[TensorMeta, list[tuple[Path, tuple[int, ...], tuple[int, ...]]]]] = {}
    names = sorted({n for layout in file_layouts.values() for n in layout})
    for name in names:
        holders = [(r, files[r]) for r in sorted(files) if name in file_layouts[files[r]]]
        metas = {file_layouts[f][name] for _, f in holders}
        if len(metas) > 1:
            problems.append(f"{name}: the ranks hold slices of different shapes or dtypes {sorted(map(str, metas))}")
            continue
        meta = next(iter(metas))
        layout = layouts.get(name)
        if layout is None:  # not in the strategy: every rank holds the whole tensor (MindSpore's hyper parameters)
            out[name] = (meta, [(holders[0][1], (0,) * len(meta.shape), meta.shape)])
            continue
        dev_matrix, tensor_map, split_shape, field, _step, shard_size, _stages = layout
        if split_shape:
            problems.append(f"{name}: an uneven split (param_split_shape {split_shape}); merge the ranks with "
                            "mindspore.unified_safetensors first")
            continue
        if field:
            problems.append(f"{name}: a field layout ({field}); merge the ranks with mindspore.unified_safetensors "
                            "first")
            continue
        if int(shard_size) > 1:  # MindSpore's own merge then takes the files' slices as optimizer shards
            problems.append(f"{name}: optimizer shard size {shard_size} (parallel optimizer): a rank's file holds "
                            f"1/{shard_size} of its model-parallel slice; merge the ranks with "
                            "mindspore.unified_safetensors first")
            continue
        devices = math.prod(int(d) for d in dev_matrix)
        chunks: dict[tuple[int, ...], tuple[Path, tuple[int, ...], tuple[int, ...]]] = {}
        strategy: tuple[int, ...] = ()
        for rank, file in holders:
            offset, strategy = slice_offset(list(dev_matrix), list(tensor_map), rank % devices, meta.shape)
            chunks.setdefault(offset, (file, offset, meta.shape))
        full = tuple(s * k for s, k in zip(meta.shape, strategy, strict=True))
        expected = math.prod(strategy)
        if len(chunks) != expected:
            problems.append(f"{name}: {len(chunks)} distinct slices of the {expected} its strategy (device matrix "
                            f"{list(dev_matrix)}, tensor map {list(tensor_map)}) makes; a rank file is missing")
            continue
        out[name] = (TensorMeta(full, meta.dtype), sorted(chunks.values(), key=lambda c: c[1]))
    return out


def unified_map(directory: Path, problems: list[str]) -> dict[str, str] | None:
    """`param_name_map.json`'s `weight_map` (None when there is none)."""
    path = directory / PARAM_NAME_MAP
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        weight_map = data["weight_map"] if isinstance(data, dict) and "weight_map" in data else data
        if not isinstance(weight_map, dict):
            raise TypeError(f"a {type(weight_map).__name__}")
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        problems.append(f"{path}: not MindSpore's parameter map ({exc})")
        return None
    return {str(k): str(v) for k, v in weight_map.items()}
