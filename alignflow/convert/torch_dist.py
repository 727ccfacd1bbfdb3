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
import ctypes
import dataclasses
import io
import json
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from alignflow.config.model import ModelConfig
from alignflow.convert.layout import CHECKPOINT_VERSION, TRACKER
from alignflow.convert.sharding import Piece, RankLayout
from alignflow.convert.summary import ProgressFn
from alignflow.convert.tensor_io import TensorMeta
from alignflow.errors import ConversionError

log = logging.getLogger(__name__)

METADATA_JSON = "metadata.json"  # dist_checkpointing's own (`save_config`): which backend wrote the directory
BACKEND = "torch_dist"
DEFAULT_FILES = 8  # .distcp files; fixed so that the bytes written do not depend on the host's core count


def iteration_dir(iteration: int) -> str:
    return f"iter_{iteration:07d}"


class TensorProducer(Protocol):
    """Tensors produced in groups (one conversion rule's outputs); `produce(i)` runs in a writer process."""

    @property
    def groups(self) -> Sequence[tuple[str, ...]]: ...

    def produce(self, index: int) -> Mapping[str, torch.Tensor]: ...


# --- writing ---------------------------------------------------------------------------------------------------

def write_torch_dist(root: Path, model: ModelConfig, producer: TensorProducer, *, iteration: int,
                     dtypes: Mapping[str, torch.dtype], files: int = DEFAULT_FILES, workers: int | None = None,
                     progress: ProgressFn | None = None) -> tuple[list[str], RankLayout]:
    """Write `root/<tracker>` and `root/iter_N/` (a torch_dist directory) with the tensors of `producer`, named and
    shaped as the TP = 1 megatron-core model of `model` has them; `dtypes` per state-dict name (default bf16).

    Returns the files written (relative to `root`) and the model's layout. Raises `ConversionError` when the
    producer's names are not exactly the model's, or a writer process fails.
    """
    from megatron.core import dist_checkpointing

    from alignflow.convert.mcore import (
        SHARDED_METADATA,
        build_gpt_model,
        cpu_collectives,
        gloo_world_of_one,
        import_megatron,
    )
    from alignflow.convert.sharding import model_layout

    import_megatron()
    out_dir = root / iteration_dir(iteration)
    out_dir.mkdir(parents=True)
    with gloo_world_of_one():
        gpt = build_gpt_model(model, device="meta")
        _retype(gpt, dtypes)
        layout = model_layout(gpt)
        _check_names(layout, producer)
        sharded = {"model": gpt.sharded_state_dict(metadata=dict(SHARDED_METADATA)),
                   "checkpoint_version": CHECKPOINT_VERSION, "iteration": int(iteration)}
        strategy = _streaming_strategy(layout, producer, files=files, workers=workers or os.cpu_count() or 1,
                                       progress=progress)
        try:
            with cpu_collectives():
                dist_checkpointing.save(sharded, str(out_dir), sharded_strategy=strategy,
                                        content_metadata=dict(SHARDED_METADATA))
        except _WorkerFailed as exc:
            raise ConversionError([str(exc)], header="writing the torch_dist checkpoint failed") from None
    (root / TRACKER).write_text(str(iteration), encoding="utf-8")
    written = sorted(str(p.relative_to(root)) for p in out_dir.rglob("*") if p.is_file())
    return [TRACKER, *written], layout


def _retype(gpt: Any, dtypes: Mapping[str, torch.dtype]) -> None:
    """Give each meta parameter / buffer the dtype of the tensor that will be written for it (DCP's metadata
    records the dtype the planner sees)."""
    owners = {**dict(gpt.named_parameters()), **dict(gpt.named_buffers())}
    for name, dtype in dtypes.items():
        tensor = owners.get(name)
        if tensor is not None and tensor.dtype != dtype:
            tensor.data = torch.empty(tensor.shape, dtype=dtype, device="meta")


def _check_names(layout: RankLayout, producer: TensorProducer) -> None:
    made = [n for g in producer.groups for n in g]
    mine = set(layout.names())
    problems = [f"megatron-core's GPTModel has no tensor {n!r} (the spec writes it)" for n in made if n not in mine]
    problems += [f"megatron-core's GPTModel has {n!r}, which no rule of the spec writes" for n in layout.names()
                 if n not in set(made)]
    if problems:
        raise ConversionError(problems, header="the spec and megatron-core's model disagree")


class _WorkerFailed(RuntimeError):
    pass


def _streaming_strategy(layout: RankLayout, producer: TensorProducer, *, files: int, workers: int,
                        progress: ProgressFn | None) -> Any:
    """megatron-core's `TorchDistSaveShardedStrategy` with `_StreamingWriter` in place of `FileSystemWriterAsync`:
    the translation to PyTorch's sharded tensors, the planner and the finalisation are megatron-core's."""
    from megatron.core.dist_checkpointing.strategies.state_dict_saver import save_state_dict_async_plan
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner,
        TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )

    writer_class = _streaming_writer_class()

    class StreamingSave(TorchDistSaveShardedStrategy):  # type: ignore[misc]
        def async_save(self, sharded_state_dict: Any, checkpoint_dir: Any) -> Any:
            flat, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict, self.keep_only_main_replica)
            pyt_state_dict = mcore_to_pyt_state_dict(flat, False)
            writer = writer_class(checkpoint_dir, thread_count=files, layout=layout, producer=producer,
                                  workers=workers, progress=progress)
            planner = MCoreSavePlanner(dedup_replicated_tensors=not self.keep_only_main_replica,
                                       flatten_state_dict=False)
            ret = save_state_dict_async_plan(pyt_state_dict, writer, None, 0, planner=planner)
            return self._get_save_and_finalize_callbacks(writer, ret[0])

    return StreamingSave(BACKEND, 1, thread_count=files)


def _streaming_writer_class() -> type:
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync
    from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import WriteItemType

    class StreamingWriter(FileSystemWriterAsync):  # type: ignore[misc]
        """Buckets of write items whose tensors are produced in the writer processes (module docstring)."""

        def __init__(self, path: Any, *, thread_count: int, layout: RankLayout, producer: TensorProducer,
                     workers: int, progress: ProgressFn | None) -> None:
            super().__init__(path, thread_count=thread_count)
            self._producer, self._workers, self._progress = producer, max(1, workers), progress
            group_of = {n: i for i, g in enumerate(producer.groups) for n in g}
            self._where: dict[tuple[str, tuple[int, ...]], tuple[int, str, Piece]] = {
                (p.key, p.offset): (group_of[t.name], t.name, p) for t in layout.tensors for p in t.pieces if p.main}

        def prepare_write_data(self, plan: Any, planner: Any) -> None:
            storage = plan.storage_data
            by_group: dict[int, list[Any]] = {}
            byte_items = []
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO:
                    byte_items.append((item, planner.resolve_data(item)))
                    continue
                where = self._where.get((item.index.fqn, tuple(item.index.offset)))
                if where is None:
                    raise ConversionError([f"{item.index.fqn} at {list(item.index.offset)}: a chunk the planner "
                                           "writes that no tensor of the layout holds"], header="torch_dist writer")
                by_group.setdefault(where[0], []).append(item)
            bins: list[list[int]] = [[] for _ in range(self.thread_count)]
            loads = [0] * self.thread_count
            sizes = {g: sum(_item_bytes(i) for i in items) for g, items in by_group.items()}
            for g in sorted(by_group, key=lambda g: (-sizes[g], g)):  # largest first, onto the lightest file
                k = loads.index(min(loads))
                bins[k].append(g)
                loads[k] += sizes[g]
            self.write_buckets: list[Any] = []
            for k, groups in enumerate(bins):
                tensor_items = [(item, self._where[(item.index.fqn, tuple(item.index.offset))])
                                for g in sorted(groups) for item in by_group[g]]
                extra = byte_items if k == 0 else []
                if not tensor_items and not extra:
                    continue
                name = f"{storage.prefix}{len(self.write_buckets)}{DEFAULT_SUFFIX}"
                self.write_buckets.append((os.path.join(self.checkpoint_dir, name), name, (extra, tensor_items)))
            self._total = sum(loads)
            self._results: dict[int, Any] = {}

        def get_save_function_and_args(self) -> tuple[Any, Any, list[Any]]:
            if not self.write_buckets:
                return None, None, []
            transforms = [self.transforms] if hasattr(self, "transforms") else []
            return (self._write_all, None, [transforms, self.write_buckets, None])

        def _write_all(self, transforms: list[Any], buckets: list[Any], _unused: Any) -> None:
            self._results = _run_writers(transforms, buckets, self._producer, self._workers, self._total,
                                         self._progress)

        def retrieve_write_results(self) -> list[Any]:
            if len(self._results) != len(self.write_buckets or []):
                raise _WorkerFailed(f"{len(self._results)} of {len(self.write_buckets or [])} files written")
            return [r for i in sorted(self._results) for r in self._results[i]]

        def storage_meta(self) -> Any:
            # DCP records the checkpoint's path and a random save id; a conversion's output is the same bytes
            # wherever and whenever it is made (its fingerprint is its identity).
            return StorageMeta(checkpoint_id=None, save_id="")

    return StreamingWriter


def _item_bytes(item: Any) -> int:
    chunk = item.tensor_data.chunk
    n = 1
    for s in chunk.sizes:
        n *= int(s)
    return n * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()


def _run_writers(transforms: list[Any], buckets: list[Any], producer: TensorProducer, workers: int, total: int,
                 progress: ProgressFn | None) -> dict[int, Any]:
    """Write the buckets (one .distcp file each) in up to `workers` forked processes; the write results by bucket,
    or the first worker's exception."""
    ctx = mp.get_context("fork")
    done = ctx.Value("q", 0)
    queue = ctx.SimpleQueue()
    order = list(range(len(buckets)))
    shares = [order[i::workers] for i in range(min(workers, len(order)))]
    procs = [ctx.Process(target=_writer_main, args=(transforms, [(i, buckets[i]) for i in share], producer, queue,
                                                    done), daemon=True) for share in shares]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failure: Exception | None = None
    try:
        while len(results) < len(buckets) and failure is None:
            while not queue.empty():
                index, value = queue.get()
                if isinstance(value, Exception):
                    failure = value
                    break
                results[index] = value
            if failure is None and len(results) < len(buckets):
                if not any(p.is_alive() for p in procs) and queue.empty():
                    codes = [p.exitcode for p in procs]
                    failure = _WorkerFailed(f"a writer process died (exit codes {codes}) before its files were "
                                            "complete")
                    break
                if progress is not None:
                    progress(done.value, total)
                time.sleep(0.05)
    finally:  # a failure, or Ctrl-C raised through `progress`: no writer outlives the conversion
        for p in procs:
            if p.is_alive() and len(results) < len(buckets):
                p.kill()
            p.join()
    if isinstance(failure, ConversionError):
        raise failure
    if failure is not None:
        raise _WorkerFailed(f"{type(failure).__name__}: {failure}")
    if progress is not None:
        progress(total, total)
    return results


def _die_with_parent() -> None:
    """A writer process ends when the converter does (kill -9 included): Linux's parent-death signal."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _writer_main(transforms: list[Any], buckets: list[tuple[int, Any]], producer: TensorProducer, queue: Any,
                 done: Any) -> None:
    from torch.distributed.checkpoint import filesystem

    _write_item: Callable[..., Any] = filesystem._write_item

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the converter handles Ctrl-C and removes the staging directory
    # A forked child must not enter the OpenMP team the parent's kernels may have started: libgomp's barrier then
    # waits for threads that were not forked (a hang seen here in `clone`). One intra-op thread per writer; the
    # writers themselves are the parallelism.
    torch.set_num_threads(1)
    kwargs: dict[str, Any] = {}
    import inspect

    if "serialization_format" in inspect.signature(_write_item).parameters:
        from torch.distributed.checkpoint.filesystem import SerializationFormat

        kwargs["serialization_format"] = SerializationFormat.TORCH_SAVE
    for index, (path, storage_key, (byte_items, tensor_items)) in buckets:
        try:
            results = []
            with open(path, "wb") as stream:
                for item, data in byte_items:
                    results.append(_write_item(*transforms, stream, data, item, storage_key, **kwargs))
                cached_group, outputs = -1, {}
                for item, (group, name, piece) in tensor_items:
                    if group != cached_group:
                        outputs = dict(producer.produce(group))
                        cached_group = group
                    data = _piece_data(outputs[name], piece)
                    results.append(_write_item(*transforms, stream, data, item, storage_key, **kwargs))
                    with done.get_lock():
                        done.value += data.numel() * data.element_size()
                os.fsync(stream.fileno())
            queue.put((index, results))
        except BaseException as exc:  # reported to the converter, which raises it with its context
            queue.put((index, exc if isinstance(exc, Exception) else _WorkerFailed(repr(exc))))
            return


def _piece_data(tensor: torch.Tensor, piece: Piece) -> torch.Tensor:
    """The piece's data with its prepended axes, owning exactly its bytes (torch.save writes a view's storage)."""
    view = piece_view(tensor.contiguous(), piece)
    if view.untyped_storage().nbytes() != view.numel() * view.element_size() or not view.is_contiguous():
        view = view.clone()
    return view.reshape(piece.size)


def piece_view(tensor: torch.Tensor, piece: Piece, *, prepended: bool = False) -> torch.Tensor:
    """The piece inside a contiguous local tensor (which may itself be a view), a view that writes through;
    `prepended`: with the global tensor's prepended axes (extent 1) in front."""
    size, stride, offset = piece.view
    view = tensor.as_strided(size, stride, tensor.storage_offset() + offset)
    for _ in range(len(piece.size) - len(size) if prepended else 0):
        view = view.unsqueeze(0)
    return view


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
        with open(self.directory / stored.file, "rb") as fh:
            fh.seek(stored.start)
            raw = fh.read(stored.length)
        tensor: torch.Tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        return tensor

    def close(self) -> None:
        self._stored = {}

    def __enter__(self) -> TorchDistCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    try:
        backend = json.loads(meta.read_text(encoding="utf-8")).get("sharded_backend")
    except (json.JSONDecodeError, AttributeError, OSError):
        return False
    return bool(backend == BACKEND)


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
    try:
        metadata = FileSystemReader(str(directory)).read_metadata()
    except (OSError, EOFError, ValueError) as exc:
        raise ConversionError([f"{directory}/.metadata: {exc}"], header=header) from None
    common: dict[str, Any] = {}
    common_pt = directory / "common.pt"
    if common_pt.is_file():
        common = torch.load(common_pt, map_location="cpu", weights_only=True)
    needed = {p.key: p.global_shape for t in layout.tensors for p in t.pieces}
    problems: list[str] = []
    seen: set[str] = set()
    stored: dict[str, list[_Stored]] = {}
    dtypes: dict[str, torch.dtype] = {}
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
