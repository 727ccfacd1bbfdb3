"""Megatron `--ckpt-format torch_dist` checkpoints, written and read through megatron-core's `dist_checkpointing`.

Layout (what Megatron-LM's `save_checkpoint` makes, docs/megatron.md#distributed-checkpoint-layout):
`<dir>/latest_checkpointed_iteration.txt` names `<dir>/iter_{N:07d}/`, a `dist_checkpointing` directory:
`metadata.json` (backend `torch_dist`), `common.pt` (everything that is not a sharded tensor: `checkpoint_version`
3.0, `iteration`, the content metadata) and PyTorch Distributed Checkpoint files (`.metadata`, `__0_K.distcp`). The
tensors are the *global* tensors of the model under their sharded keys, so one checkpoint loads at any TP / PP / EP.

Writing: the sharded state dict is that of a real megatron-core `GPTModel` of the experiment's model, built on
`meta` in a gloo world of one (`alignflow.convert.mcore`), handed to `dist_checkpointing.save` with Megatron-LM's
content metadata. Only the last stage differs from Megatron's own save: instead of holding every tensor in memory
(its `FileSystemWriterAsync` stages them all before forking its writers), `_StreamingWriter` hands each writer
process the *names* of its tensors, and the process converts them from the source one conversion rule at a time
(`TensorProducer`) and writes each with DCP's own `_write_item`. The work is spread over the host's cores; memory
per process is the tensors of one rule.

Reading: `open_torch_dist` opens the directory as a `TensorSource` of TP = 1 state-dict names (the names of the
legacy format), assembling each tensor from the stored chunks that overlap it, whatever layout saved them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch

from alignflow.config.model import ModelConfig
from alignflow.convert.dist_writer import (
    TensorProducer,
    WorkerFailed,
    WriterPool,
    assign,
    piece_view,
    streaming_strategy,
)
from alignflow.convert.layout import CHECKPOINT_VERSION, TRACKER
from alignflow.convert.sharding import RankLayout
from alignflow.convert.summary import ProgressFn
from alignflow.convert.tensor_io import TensorMeta
from alignflow.convert.unreadable import reading, storage_problems, zip_problem
from alignflow.errors import ConversionError

log = logging.getLogger(__name__)

METADATA_JSON = "metadata.json"  # dist_checkpointing's own (`save_config`): which backend wrote the directory
BACKEND = "torch_dist"
DEFAULT_FILES = 8  # .distcp files; fixed so that the bytes written do not depend on the host's core count


def iteration_dir(iteration: int) -> str:
    return f"iter_{iteration:07d}"


# --- writing ---------------------------------------------------------------------------------------------------

def write_torch_dist(root: Path, model: ModelConfig, producer: TensorProducer, *, iteration: int,
                     dtypes: Mapping[str, torch.dtype], files: int = DEFAULT_FILES, workers: int | None = None,
                     progress: ProgressFn | None = None) -> tuple[list[str], RankLayout]:
    """Write `root/<tracker>` and `root/iter_N/` (a torch_dist directory) with the tensors of `producer`, named and
    shaped as the TP = 1 megatron-core model of `model` has them; `dtypes` per state-dict name (default bf16).

    With the model's layout in the layout cache, the writer processes start at once and megatron-core is imported
    and the save planned while they convert; the plan must then be the cached layout's (else they are stopped and
    started again from the plan). Returns the files written (relative to `root`) and the model's layout. Raises
    `ConversionError` when the producer's names are not exactly the model's, or a writer process fails.
    """
    from alignflow.convert.sharding import cached_layout, store_layout

    out_dir = root / iteration_dir(iteration)
    out_dir.mkdir(parents=True)
    workers = workers or os.cpu_count() or 1
    pool: WriterPool | None = None
    cached = cached_layout(model)
    try:
        if cached is not None and _name_problems(cached, producer) == []:
            pool = WriterPool(out_dir, assign(cached, producer, dtypes, files), producer, workers).start()
        layout = _save(out_dir, model, producer, iteration=iteration, dtypes=dtypes, files=files, workers=workers,
                       progress=progress, pool=pool, cached=cached)
    finally:
        if pool is not None:
            pool.abort()
    store_layout(model, layout)
    (root / TRACKER).write_text(str(iteration), encoding="utf-8")
    written = sorted(str(p.relative_to(root)) for p in out_dir.rglob("*") if p.is_file())
    return [TRACKER, *written], layout


def _save(out_dir: Path, model: ModelConfig, producer: TensorProducer, *, iteration: int,
          dtypes: Mapping[str, torch.dtype], files: int, workers: int, progress: ProgressFn | None,
          pool: WriterPool | None, cached: RankLayout | None) -> RankLayout:
    from alignflow.convert.mcore import (
        SHARDED_METADATA,
        build_gpt_model,
        cpu_collectives,
        gloo_world_of_one,
        import_megatron,
    )
    from alignflow.convert.sharding import model_layout

    import_megatron()
    from megatron.core import dist_checkpointing

    with gloo_world_of_one():
        gpt = build_gpt_model(model, device="meta")
        _retype(gpt, dtypes)
        layout = model_layout(gpt)
        problems = _name_problems(layout, producer)
        if problems:
            raise ConversionError(problems, header="the spec and megatron-core's model disagree")
        if pool is not None and layout != cached:  # a stale cache: the writers start again from the real layout
            pool.abort()
            pool = None
        if pool is None:
            pool = WriterPool(out_dir, assign(layout, producer, dtypes, files), producer, workers).start()
        sharded = {"model": gpt.sharded_state_dict(metadata=dict(SHARDED_METADATA)),
                   "checkpoint_version": CHECKPOINT_VERSION, "iteration": int(iteration)}
        try:
            with cpu_collectives(), _quiet_overwrite_warning():
                dist_checkpointing.save(sharded, str(out_dir), sharded_strategy=streaming_strategy(
                    pool, progress=progress), content_metadata=dict(SHARDED_METADATA))
        except WorkerFailed as exc:
            raise ConversionError([str(exc)], header="writing the torch_dist checkpoint failed") from None
        finally:
            pool.abort()
    return layout


@contextlib.contextmanager
def _quiet_overwrite_warning() -> Iterator[None]:
    """dist_checkpointing.save warns "Overwriting old incomplete / corrupted checkpoint..." for a directory that is
    not empty: here it is the fresh staging directory the writers have begun to fill."""
    logger = logging.getLogger("megatron.core.dist_checkpointing.serialization")

    def drop(record: logging.LogRecord) -> bool:
        return "Overwriting old incomplete" not in record.getMessage()

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _retype(gpt: Any, dtypes: Mapping[str, torch.dtype]) -> None:
    """Give each meta parameter / buffer the dtype of the tensor that will be written for it (DCP's metadata
    records the dtype the planner sees)."""
    owners = {**dict(gpt.named_parameters()), **dict(gpt.named_buffers())}
    for name, dtype in dtypes.items():
        tensor = owners.get(name)
        if tensor is not None and tensor.dtype != dtype:
            tensor.data = torch.empty(tensor.shape, dtype=dtype, device="meta")


def _name_problems(layout: RankLayout, producer: TensorProducer) -> list[str]:
    made = [n for g in producer.groups for n in g]
    mine = set(layout.names())
    problems = [f"megatron-core's GPTModel has no tensor {n!r} (the spec writes it)" for n in made if n not in mine]
    problems += [f"megatron-core's GPTModel has {n!r}, which no rule of the spec writes" for n in layout.names()
                 if n not in set(made)]
    return problems


# --- reading ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class _Stored:
    offset: tuple[int, ...]
    size: tuple[int, ...]
    file: str
    start: int
    length: int


class TorchDistCheckpoint:
    """A torch_dist checkpoint opened as a `TensorSource` of TP = 1 state-dict names (streaming: `read` loads the
    stored chunks one tensor needs)."""

    def __init__(self, path: Path, directory: Path, layout: RankLayout, iteration: int | None,
                 stored: dict[str, list[_Stored]], dtypes: dict[str, torch.dtype],
                 common: dict[str, Any]) -> None:
        self.path, self.directory, self.layout, self.iteration = path, directory, layout, iteration
        self.common = common
        self._stored = stored
        self._by_name = {t.name: t for t in layout.tensors}
        self.tensors: dict[str, TensorMeta] = {
            t.name: TensorMeta(t.shape, dtypes[t.pieces[0].key]) for t in layout.tensors}
        self.others: dict[str, Any] = dict.fromkeys(layout.extra_state)

    def read(self, name: str) -> torch.Tensor:
        local = self._by_name[name]
        out = torch.empty(local.shape, dtype=self.tensors[name].dtype)
        for piece in local.pieces:
            target = piece_view(out, piece, prepended=True)
            fill_region(target, piece.key, piece.offset, self._chunks(piece.key))
        return out

    def _chunks(self, key: str) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], Callable[[], torch.Tensor]]]:
        for s in self._stored[key]:
            yield s.offset, s.size, partial(self._load, s)

    def _load(self, stored: _Stored) -> torch.Tensor:
        file = self.directory / stored.file
        header = f"cannot read the torch_dist checkpoint {self.path}"
        with reading(file, header=header):
            raw = read_item(file, stored.start, stored.length)
            problem = zip_problem(raw)
            if problem is not None:
                raise ConversionError([f"{file}: bytes {stored.start}-{stored.start + stored.length}: {problem}"],
                                      header=header)
            tensor: torch.Tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        return tensor

    def close(self) -> None:
        self._stored = {}

    def __enter__(self) -> TorchDistCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_item(file: Path, start: int, length: int) -> bytes:
    """The `length` bytes at `start` of a `.distcp` file (one stored item)."""
    with open(file, "rb") as fh:
        fh.seek(start)
        raw = fh.read(length)
    if len(raw) != length:
        raise EOFError(f"{length} bytes at {start} wanted, {len(raw)} there")
    return raw


def _object_problems(directory: Path, metadata: Any, header: str) -> list[str]:
    """The stored sharded objects whose `torch.save` bytes fail their CRCs (they are small: read them all)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    problems = []
    for index, info in metadata.storage_data.items():
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        file = directory / str(info.relative_path)
        with reading(file, header=header):
            problem = zip_problem(read_item(file, int(info.offset), int(info.length)))
        if problem is not None:
            problems.append(f"{file}: {index.fqn}: {problem}")
    return problems


def fill_region(target: torch.Tensor, key: str, offset: tuple[int, ...],
                chunks: Iterator[tuple[tuple[int, ...], tuple[int, ...], Callable[[], torch.Tensor]]]) -> None:
    """Copy into `target` (the region of global tensor `key` at `offset`) every overlapping stored chunk; a region
    not fully covered is a `ConversionError`."""
    covered = 0
    for c_offset, c_size, load in chunks:
        lo = [max(a, b) for a, b in zip(offset, c_offset, strict=True)]
        hi = [min(a + s, b + t) for a, s, b, t in zip(offset, target.shape, c_offset, c_size, strict=True)]
        if any(h <= low for low, h in zip(lo, hi, strict=True)):
            continue
        data = load().reshape(c_size)
        src = data[tuple(slice(a - b, h - b) for a, h, b in zip(lo, hi, c_offset, strict=True))]
        target[tuple(slice(a - b, h - b) for a, h, b in zip(lo, hi, offset, strict=True))] = src
        n = 1
        for a, h in zip(lo, hi, strict=True):
            n *= h - a
        covered += n
    if covered != target.numel():
        raise ConversionError([f"{key}: the stored chunks cover {covered} of the {target.numel()} elements at "
                               f"offset {list(offset)}"], header="torch_dist checkpoint incomplete")


def resolve_directory(src: Path) -> tuple[Path, int | None]:
    """The `dist_checkpointing` directory of `src` (a tracker directory, or the `iter_*` directory itself)."""
    tracker = src / TRACKER
    if tracker.is_file():
        text = tracker.read_text(encoding="utf-8").strip()
        if text == "release":
            return src / "release", None
        if not text.isdigit():
            raise ConversionError([f"{tracker}: expected an iteration number or 'release', found {text[:40]!r}"],
                                  header="cannot open the torch_dist checkpoint")
        return src / iteration_dir(int(text)), int(text)
    return src, None


def is_torch_dist(src: Path) -> bool:
    directory, _ = resolve_directory(Path(src)) if Path(src).is_dir() else (Path(src), None)
    meta = directory / METADATA_JSON
    if not meta.is_file():
        return False
    with reading(meta, header=f"cannot open the distributed checkpoint {directory}"):
        doc = json.loads(meta.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ConversionError([f"{meta}: not a JSON object"], header=f"cannot open the distributed checkpoint "
                              f"{directory}")
    return bool(doc.get("sharded_backend") == BACKEND)


def open_torch_dist(src: Path, layout: RankLayout, *, partial: bool = False) -> TorchDistCheckpoint:
    """Open `src` for reading the tensors of `layout` (the TP = 1 layout of the model it holds, or - `partial` - one
    rank's). Every global tensor the layout needs must be stored with its global shape, and (unless `partial`)
    nothing else may be stored."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex, TensorStorageMetadata

    src = Path(src)
    header = f"cannot open the torch_dist checkpoint {src}"
    directory, iteration = resolve_directory(src)
    if not is_torch_dist(directory):
        raise ConversionError([f"{directory}: no {METADATA_JSON} naming the torch_dist backend"], header=header)
    with reading(directory / ".metadata", header=header):
        metadata = FileSystemReader(str(directory)).read_metadata()
    # Megatron's loader reads common.pt first (`dist_checkpointing.load_common`) up to megatron-core 0.18; 0.19 keeps
    # the common state inside the DCP files (the writer of that release writes no common.pt): absent is not damaged
    common: dict[str, Any] = {}
    common_pt = directory / "common.pt"
    if common_pt.exists():
        with reading(common_pt, header=header):
            loaded = torch.load(common_pt, map_location="cpu", weights_only=True)
        if not isinstance(loaded, dict):
            raise ConversionError([f"{common_pt}: holds a {type(loaded).__name__}, not a dict"], header=header)
        common = loaded
    needed = {p.key: p.global_shape for t in layout.tensors for p in t.pieces}
    problems: list[str] = storage_problems(directory, metadata)
    seen: set[str] = set()
    stored: dict[str, list[_Stored]] = {}
    dtypes: dict[str, torch.dtype] = {}
    if not problems:  # the sharded objects (`_extra_state`) are not converted; a damaged one is a damaged checkpoint
        problems = _object_problems(directory, metadata, header)
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, BytesStorageMetadata):
            continue  # sharded objects (`_extra_state`)
        assert isinstance(entry, TensorStorageMetadata)
        seen.add(key)
        if key not in needed:
            if not partial:
                problems.append(f"unexpected tensor {key!r} {list(entry.size)}: the model has no such global tensor")
            continue
        if tuple(entry.size) != needed[key]:
            problems.append(f"{key}: stored with global shape {list(entry.size)}, the model's is {list(needed[key])}")
            continue
        dtypes[key] = entry.properties.dtype
        chunks = []
        for chunk in entry.chunks:
            info = metadata.storage_data[MetadataIndex(key, chunk.offsets)]
            chunks.append(_Stored(tuple(chunk.offsets), tuple(chunk.sizes), str(info.relative_path),
                                  int(info.offset), int(info.length)))
        stored[key] = chunks
    problems += [f"missing tensor {k!r} {list(s)}" for k, s in needed.items() if k not in seen]
    if problems:
        raise ConversionError(problems, header=header)
    return TorchDistCheckpoint(src, directory, layout, iteration if iteration is not None else
                               common.get("iteration"), stored, dtypes, common)
