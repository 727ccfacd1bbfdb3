"""Tensor I/O of the converters: streaming safetensors writer, pread reader, tensor metadata, the source protocol.

`safetensors.torch.save_file` needs every tensor in memory at once; a converter that streams a multi-GB
checkpoint cannot afford that (issue 4: peak RSS <= 1.5x the largest output file + 300 MB). The format makes
streaming easy: an 8-byte little-endian header length, a JSON header with every tensor's dtype, shape and byte
range, then the bytes in header order. Every shape and dtype is known before any data is read (from the
source headers and the plan), so the header is written first and each tensor goes straight to the file.
Files written here are read back with `safetensors.safe_open` in the tests (and by MindSpore).

Reading opens the file anew for every tensor (`read_tensor`): safetensors' mmap backend hands out zero-copy
tensors, but one long-lived handle keeps every page it ever touched mapped, so reading a 4 GB file tensor by
tensor through it would end at 4 GB of RSS. A handle per tensor parses the header again (well under a
millisecond) and lets each mapping go with its tensor; measured on the 1B benchmark file it is also faster
than one handle, and faster than the pread backend, which copies every byte.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Protocol

import torch
from safetensors import SafetensorError, safe_open

# torch dtype <-> safetensors dtype code (the codes of the format's specification).
DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
CODE_DTYPES: dict[str, torch.dtype] = {code: dtype for dtype, code in DTYPE_CODES.items()}
CAST_CHUNK_ELEMENTS = 4 * 1024 * 1024  # per cast chunk: 8-16 MB, large enough for the vectorised kernels

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What a plan needs to know about a tensor before reading it."""

    shape: Shape
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * _itemsize(self.dtype)


class TensorSource(Protocol):
    """A checkpoint opened for conversion: every tensor's metadata up front, the data one tensor at a time."""

    @property
    def tensors(self) -> Mapping[str, TensorMeta]: ...

    def read(self, name: str) -> torch.Tensor: ...

    def close(self) -> None: ...


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class StreamingSafetensorsWriter:
    """Write the tensors declared in `layout`, in that order, each as soon as it is ready.

    `write` refuses a tensor out of order or of another shape/dtype; `close` refuses to finish a file with
    tensors missing, so a half-written file never looks complete. With `cast=True` (the bf16 conversion only) a
    floating tensor of another floating dtype is cast to the layout's dtype instead of refused.
    """

    def __init__(self, path: Path, layout: Sequence[tuple[str, TensorMeta]],
                 metadata: Mapping[str, str] | None = None, *, cast: bool = False) -> None:
        self.path = path
        self.cast = cast
        self._layout = list(layout)
        self._next = 0
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        offset = 0
        for name, meta in self._layout:
            if meta.dtype not in DTYPE_CODES:
                raise ValueError(f"{name}: dtype {meta.dtype} cannot be stored in safetensors")
            end = offset + meta.nbytes
            header[name] = {"dtype": DTYPE_CODES[meta.dtype], "shape": list(meta.shape), "data_offsets": [offset, end]}
            offset = end
        if len(header) != len(self._layout) + (1 if metadata else 0):
            raise ValueError(f"{path.name}: duplicate tensor names in the layout")
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # the reference writer pads the header to 8-byte alignment
        self._fh: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()/__exit__
        self._fh.write(struct.pack("<Q", len(raw)))
        self._fh.write(raw)
        self.bytes_written = 0
        self._buffer: torch.Tensor | None = None

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append `tensor` as `name`. With `cast=True` a floating tensor of another floating dtype is cast on the
        way, chunk by chunk into one reused buffer (`copy_`, the kernel of `Tensor.to`), so a large tensor never
        exists twice in memory; otherwise a dtype other than the layout's is refused."""
        if self._next >= len(self._layout):
            raise ValueError(f"{self.path.name}: {name!r} is not in the file's layout (all tensors written)")
        want_name, meta = self._layout[self._next]
        if name != want_name:
            raise ValueError(f"{self.path.name}: expected {want_name!r} next, got {name!r}")
        castable = self.cast and tensor.dtype.is_floating_point and meta.dtype.is_floating_point
        if tuple(tensor.shape) != meta.shape or (tensor.dtype != meta.dtype and not castable):
            raise ValueError(f"{self.path.name}: {name!r} is {list(tensor.shape)} {tensor.dtype}, layout says "
                             f"{list(meta.shape)} {meta.dtype}")
        flat = tensor.detach().contiguous().reshape(-1)
        if tensor.dtype == meta.dtype:
            if flat.numel():
                self._fh.write(flat.view(torch.uint8).numpy().data)
        else:
            for start in range(0, flat.numel(), CAST_CHUNK_ELEMENTS):
                part = flat[start : start + CAST_CHUNK_ELEMENTS]
                buf = self._cast_buffer(meta.dtype, part.numel())
                buf.copy_(part)
                self._fh.write(buf.view(torch.uint8).numpy().data)
        self._next += 1
        self.bytes_written += meta.nbytes

    def _cast_buffer(self, dtype: torch.dtype, n: int) -> torch.Tensor:
        if self._buffer is None or self._buffer.dtype != dtype:
            self._buffer = torch.empty(CAST_CHUNK_ELEMENTS, dtype=dtype)
        return self._buffer[:n]

    def close(self) -> None:
        if self._fh.closed:
            return
        self._fh.close()
        if self._next != len(self._layout):
            missing = [n for n, _ in self._layout[self._next :]]
            raise ValueError(f"{self.path.name}: {len(missing)} tensor(s) never written, first {missing[0]!r}")

    def __enter__(self) -> StreamingSafetensorsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self._fh.close()
            return
        self.close()


class SafetensorsFileError(ValueError):
    """A safetensors file that cannot be read as one: which file, which tensor (if one is to blame), and why."""

    def __init__(self, path: Path, reason: str, tensor: str | None = None) -> None:
        self.path, self.reason, self.tensor = path, reason, tensor
        where = f"{path}: tensor {tensor!r}" if tensor is not None else str(path)
        super().__init__(f"{where}: {reason}")


def read_tensor(path: Path, name: str) -> torch.Tensor:
    """One tensor of a safetensors file, through a handle of its own (see the module docstring).

    The safetensors library's own errors (a file truncated or rewritten since its header was checked) become
    `SafetensorsFileError` naming the file and the tensor.
    """
    try:
        with safe_open(str(path), framework="pt") as handle:
            tensor: torch.Tensor = handle.get_tensor(name)
    except (SafetensorError, OSError) as exc:
        raise SafetensorsFileError(path, f"cannot be read ({exc})", name) from None
    return tensor


def read_layout(path: Path) -> dict[str, TensorMeta]:
    """Names, shapes and dtypes of a safetensors file, from its header; the header is checked against the file.

    What the safetensors library itself requires before it hands out a tensor (`Metadata::validate` in
    https://github.com/huggingface/safetensors/blob/main/safetensors/src/tensor.rs): the header fits in the file,
    every tensor's `data_offsets` span exactly its dtype x shape, and the tensors tile the byte buffer after the
    header - no overlap, no hole, nothing missing at the end (a truncated file). Checked here, for every file,
    before any tensor is read or anything written, so a damaged file is one `SafetensorsFileError` naming the
    file, the tensor and the reason instead of a library traceback halfway through a conversion.
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        if len(head) != 8:
            raise SafetensorsFileError(path, f"not a safetensors file ({size} bytes, shorter than its 8-byte header "
                                       "length)")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise SafetensorsFileError(path, f"not a safetensors file (header length {n})")
        if 8 + n > size:
            raise SafetensorsFileError(path, f"truncated: the header is {n} bytes, the file has {size - 8} after "
                                       "the header length")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsFileError(path, f"not a safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsFileError(path, "not a safetensors file (the header is not a JSON object)")
    out: dict[str, TensorMeta] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        meta, span = _entry(path, name, entry)
        out[name] = meta
        spans.append((*span, name))
    _check_tiling(path, spans, size - 8 - n)
    return out


def _entry(path: Path, name: str, entry: Any) -> tuple[TensorMeta, tuple[int, int]]:
    """One header entry as (metadata, byte span), or `SafetensorsFileError` saying what is wrong with it."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise SafetensorsFileError(path, "header entry needs dtype, shape and data_offsets", name)
    if entry["dtype"] not in CODE_DTYPES:
        raise SafetensorsFileError(path, f"dtype {entry['dtype']}, which alignflow does not convert", name)
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape):
        raise SafetensorsFileError(path, f"shape {shape!r} is not a list of non-negative integers", name)
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
        raise SafetensorsFileError(path, f"data_offsets {offsets!r} is not [start, end]", name)
    meta = TensorMeta(tuple(shape), CODE_DTYPES[entry["dtype"]])
    start, end = offsets
    if end - start != meta.nbytes:
        raise SafetensorsFileError(path, f"data_offsets [{start}, {end}] span {end - start} bytes; {entry['dtype']} "
                                   f"{shape} needs {meta.nbytes}", name)
    return meta, (start, end)


def _check_tiling(path: Path, spans: list[tuple[int, int, str]], buffer_bytes: int) -> None:
    """The tensors' byte ranges must tile the buffer: in order, no overlap, no hole, ending at its end."""
    for start, end, name in sorted(spans, key=lambda s: -s[1]):
        if end > buffer_bytes:
            raise SafetensorsFileError(path, f"data_offsets [{start}, {end}] run past the end of the file (the data "
                                       f"after the header is {buffer_bytes} bytes: truncated?)", name)
    at, previous = 0, None
    for start, end, name in sorted(spans):
        if start < at:
            raise SafetensorsFileError(path, f"bytes [{start}, {min(end, at)}) are shared with tensor {previous!r} "
                                       "(overlapping tensors)", name)
        if start > at:
            raise SafetensorsFileError(path, f"bytes [{at}, {start}) before it belong to no tensor", name)
        at, previous = end, name
    if at != buffer_bytes:
        raise SafetensorsFileError(path, f"{buffer_bytes - at} bytes after the last tensor belong to no tensor")
