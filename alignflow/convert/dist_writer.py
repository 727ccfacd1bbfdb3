"""The writing stage of a torch_dist save, streamed: forked writer processes convert their tensors one conversion
rule at a time and write each piece with `torch.save`, as DCP's `_write_item` does; megatron-core's
`dist_checkpointing.save` plans, names and finalises the checkpoint around them (`StreamingSave`).

Which piece goes into which `__0_K.distcp` file is decided from the model's layout alone (`assign`: whole rules,
largest first onto the lightest of a fixed number of files), so that the bytes do not depend on the host's cores,
and so that the writers can start as soon as the layout is known - from the layout cache, before megatron-core is
even imported (`alignflow.convert.sharding.cached_layout`). `StreamingWriter.prepare_write_data` then checks that
the DCP plan's items are exactly the assigned pieces, writes the sharded objects (`_extra_state`) into one more
file, and turns the writers' records into DCP's `WriteResult`s.

Each writer is forked with one intra-op thread (a forked child must not enter an OpenMP team its parent started:
libgomp waits for threads that were not forked), ignores Ctrl-C (the converter decides), and dies with the
converter (Linux's parent-death signal): a killed conversion leaves no writer behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, cast

import torch

from alignflow.convert.sharding import Piece, RankLayout
from alignflow.convert.summary import ProgressFn
from alignflow.errors import ConversionError
from alignflow.staging import check_interrupted

PREFIX = "__0_"  # DCP's storage prefix of rank 0 (megatron-core's `prepare_decentralized_global_plan`)
SUFFIX = ".distcp"
Record = tuple[str, tuple[int, ...], str, int, int]  # (key, offset, file, start, length)


class TensorProducer(Protocol):
    """Tensors produced in groups (one conversion rule's outputs); `produce(i)` runs in a writer process."""

    @property
    def groups(self) -> Sequence[tuple[str, ...]]: ...

    def produce(self, index: int) -> Mapping[str, torch.Tensor]: ...


class WorkerFailed(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Assignment:
    """Per file, the pieces it holds in order: (group, state-dict name, piece); and the bytes of them all."""

    files: tuple[tuple[tuple[int, str, Piece], ...], ...]
    total_bytes: int


def _piece_bytes(piece: Piece, dtype: torch.dtype) -> int:
    n = 1
    for s in piece.size:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


def assign(layout: RankLayout, producer: TensorProducer, dtypes: Mapping[str, torch.dtype], files: int
           ) -> Assignment:
    """Every main-replica piece of `layout` in one of `files` files: each rule's pieces together (a writer converts a
    rule once), rules largest first onto the lightest file, each file in rule order."""
    tensors = {t.name: t for t in layout.tensors}
    groups = [[(g, name, p) for name in names for p in tensors[name].pieces if p.main]
              for g, names in enumerate(producer.groups)]
    sizes = [sum(_piece_bytes(p, dtypes.get(n, torch.bfloat16)) for _, n, p in items) for items in groups]
    bins: list[list[int]] = [[] for _ in range(files)]
    loads = [0] * files
    for g in sorted(range(len(groups)), key=lambda g: (-sizes[g], g)):
        k = loads.index(min(loads))
        bins[k].append(g)
        loads[k] += sizes[g]
    return Assignment(tuple(tuple(item for g in sorted(b) for item in groups[g]) for b in bins), sum(sizes))


def piece_data(tensor: torch.Tensor, piece: Piece) -> torch.Tensor:
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


class _NoClose(io.RawIOBase):
    """What DCP's `_StorageWriterTransforms` hands torch.save: the file's stream, which torch.save may not close."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return int(self.raw.write(b))

    def close(self) -> None:
        self.raw.flush()


class WriterPool:
    """Forked processes writing the assigned files; `wait` returns where each piece landed."""

    def __init__(self, directory: Path, assignment: Assignment, producer: TensorProducer, workers: int) -> None:
        self.directory, self.assignment, self.producer = directory, assignment, producer
        self.workers = max(1, min(workers, len(assignment.files)))
        self._ctx = mp.get_context("fork")
        self._done = self._ctx.Value("q", 0)
        self._queue = self._ctx.SimpleQueue()
        self._procs: list[Any] = []
        self._results: dict[int, list[Record]] = {}

    @staticmethod
    def file_name(k: int) -> str:
        return f"{PREFIX}{k}{SUFFIX}"

    def start(self) -> WriterPool:
        order = list(range(len(self.assignment.files)))
        for i in range(self.workers):
            share = order[i::self.workers]
            p = self._ctx.Process(target=_writer_main, args=(self.directory, share, self.assignment, self.producer,
                                                             self._queue, self._done), daemon=True)
            p.start()
            self._procs.append(p)
        return self

    def wait(self, progress: ProgressFn | None) -> dict[tuple[str, tuple[int, ...]], tuple[str, int, int]]:
        """Every piece's (file, start, length), once all files are written; the first failure raised."""
        total = self.assignment.total_bytes
        wanted = len(self.assignment.files)
        failure: BaseException | None = None
        try:
            while len(self._results) < wanted and failure is None:
                while not self._queue.empty():
                    index, value = self._queue.get()
                    if isinstance(value, BaseException):
                        failure = value
                        break
                    self._results[index] = value
                if failure is None and len(self._results) < wanted:
                    check_interrupted()  # a held Ctrl-C / SIGTERM: the writers are killed, the staging removed
                    if not any(p.is_alive() for p in self._procs) and self._queue.empty():
                        codes = [p.exitcode for p in self._procs]
                        failure = WorkerFailed(f"a writer process died (exit codes {codes}) before its files were "
                                               "complete")
                        break
                    if progress is not None:
                        progress(self._done.value, total)
                    time.sleep(0.05)
        finally:  # a failure, or Ctrl-C raised through `progress`: no writer outlives the conversion
            if len(self._results) < wanted:
                self.abort()
            for p in self._procs:
                p.join()
        if isinstance(failure, ConversionError):
            raise failure
        if failure is not None:
            raise WorkerFailed(f"{type(failure).__name__}: {failure}")
        if progress is not None:
            progress(total, total)
        return {(key, off): (file, start, length) for recs in self._results.values()
                for key, off, file, start, length in recs}

    def abort(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()


def _die_with_parent() -> None:
    """A writer process ends when the converter does (kill -9 included): Linux's parent-death signal."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _reuse_freed_memory() -> None:
    """Keep freed large blocks in the heap (glibc `mallopt`): a writer allocates tensors of the same few sizes over
    and over (one per layer), and fresh mmap'd pages cost a page fault and zeroing each; measured on the 2.16 GB
    benchmark input, reading every tensor took 1.95 CPU-s without, 1.13 with. The peak RSS is unchanged: the heap
    keeps what the largest rule needed."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: blocks below 1 GiB come from the heap
        libc.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD: and stay there once freed


def _writer_main(directory: Path, share: list[int], assignment: Assignment, producer: TensorProducer, queue: Any,
                 done: Any) -> None:
    _die_with_parent()
    _reuse_freed_memory()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the converter handles Ctrl-C and removes the staging directory
    torch.set_num_threads(1)  # see the module docstring
    for k in share:
        name = WriterPool.file_name(k)
        try:
            records: list[Record] = []
            with open(directory / name, "wb") as stream:
                cached_group, outputs = -1, {}
                for group, tensor_name, piece in assignment.files[k]:
                    if group != cached_group:
                        outputs = dict(producer.produce(group))
                        cached_group = group
                    data = piece_data(outputs[tensor_name], piece)
                    start = stream.tell()
                    torch.save(data, cast(IO[bytes], _NoClose(stream)))
                    records.append((piece.key, piece.offset, name, start, stream.tell() - start))
                    with done.get_lock():
                        done.value += data.numel() * data.element_size()
                stream.flush()
                os.fsync(stream.fileno())
            queue.put((k, records))
        except BaseException as exc:  # reported to the converter, which raises it with its context
            queue.put((k, exc if isinstance(exc, Exception) else WorkerFailed(repr(exc))))
            return


def streaming_strategy(pool: WriterPool, *, progress: ProgressFn | None) -> Any:
    """megatron-core's `TorchDistSaveShardedStrategy` with `StreamingWriter` in place of `FileSystemWriterAsync`:
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
        def async_save(self, sharded_state_dict: Any, checkpoint_dir: Any, **options: Any) -> Any:
            # megatron-core >= 0.19 passes `async_strategy` on to `_get_save_and_finalize_callbacks`
            flat, _, _ = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict, self.keep_only_main_replica)
            pyt_state_dict = mcore_to_pyt_state_dict(flat, False)
            writer = writer_class(checkpoint_dir, thread_count=len(pool.assignment.files) + 1, pool=pool,
                                  progress=progress)
            planner = MCoreSavePlanner(dedup_replicated_tensors=not self.keep_only_main_replica,
                                       flatten_state_dict=False)
            ret = save_state_dict_async_plan(pyt_state_dict, writer, None, 0, planner=planner)
            return self._get_save_and_finalize_callbacks(writer, ret[0], **options)

    return StreamingSave("torch_dist", 1)


def _streaming_writer_class() -> type:
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult

    class StreamingWriter(FileSystemWriterAsync):  # type: ignore[misc]
        """The pool's files for the tensors, one more file for the sharded objects (module docstring)."""

        def __init__(self, path: Any, *, thread_count: int, pool: WriterPool, progress: ProgressFn | None) -> None:
            super().__init__(path, thread_count=thread_count)
            self._pool, self._progress = pool, progress
            self._results: list[Any] = []

        def prepare_write_data(self, plan: Any, planner: Any) -> None:
            if plan.storage_data.prefix != PREFIX:
                raise ConversionError([f"DCP's storage prefix is {plan.storage_data.prefix!r}, not {PREFIX!r}"],
                                      header="torch_dist writer")
            assigned = {(p.key, p.offset) for f in self._pool.assignment.files for _, _, p in f}
            self._bytes = [(item, planner.resolve_data(item)) for item in plan.items
                           if item.type == WriteItemType.BYTE_IO]
            self._tensors = [item for item in plan.items if item.type != WriteItemType.BYTE_IO]
            planned = {(i.index.fqn, tuple(i.index.offset)) for i in self._tensors}
            if planned != assigned:
                odd = sorted(planned ^ assigned)[:5]
                raise ConversionError([f"the DCP plan and the layout's pieces differ: {odd}"],
                                      header="torch_dist writer")
            self.write_buckets = [(os.path.join(self.checkpoint_dir, WriterPool.file_name(k)), "", ())
                                  for k in range(len(self._pool.assignment.files) + 1)]

        def get_save_function_and_args(self) -> tuple[Any, Any, list[Any]]:
            transforms = [self.transforms] if hasattr(self, "transforms") else []
            return (self._write_all, None, [transforms, None, None])

        def _write_all(self, transforms: list[Any], _buckets: Any, _queue: Any) -> None:
            kwargs: dict[str, Any] = {}
            if hasattr(filesystem, "SerializationFormat"):
                kwargs["serialization_format"] = filesystem.SerializationFormat.TORCH_SAVE
            name = WriterPool.file_name(len(self._pool.assignment.files))
            results = []
            write_item: Any = filesystem._write_item
            with open(os.path.join(self.checkpoint_dir, name), "wb") as stream:
                for item, data in self._bytes:
                    results.append(write_item(*transforms, stream, data, item, name, **kwargs))
                stream.flush()
                os.fsync(stream.fileno())
            where = self._pool.wait(self._progress)
            for item in self._tensors:
                file, start, length = where[(item.index.fqn, tuple(item.index.offset))]
                results.append(WriteResult(index=item.index, size_in_bytes=length,
                                           storage_data=filesystem._StorageInfo(file, start, length)))
            self._results = results

        def retrieve_write_results(self) -> list[Any]:
            return self._results

        def storage_meta(self) -> Any:
            # DCP records the checkpoint's path and a random save id; a conversion's output is the same bytes
            # wherever and whenever it is made (its fingerprint is its identity).
            return StorageMeta(checkpoint_id=None, save_id="")

    return StreamingWriter
