"""Megatron's indexed dataset: `<prefix>.bin` (the token ids of every sequence, back to back) and `<prefix>.idx`.

The `.idx` layout is megatron-core's `_IndexWriter.write` / `_IndexReader.__init__`
(https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/datasets/indexed_dataset.py), unchanged
from core 0.16 to 0.19:

    b"MMIDIDX\\x00\\x00"              9 bytes, the magic
    <Q version = 1                   8 bytes
    <B dtype code                    1 byte (DType: uint8 1, int8 2, int16 3, int32 4, int64 5, float64 6,
                                             float32 7, uint16 8)
    <Q sequence count N              8 bytes
    <Q document count D              8 bytes (= documents + 1: `document_indices` starts with 0)
    int32[N] sequence lengths        tokens of each sequence
    int64[N] sequence pointers       byte offset of each sequence in the .bin
    int64[D] document indices        sequence index where each document ends (0 first)

`IndexedDatasetBuilder.add_document(tokens, [len])` writes one sequence per document, which is how
`tools/preprocess_data.py` and this module write them; `GPTDataset` indexes *sequences*
(`numel_low_level_dataset` is `sequence_lengths.shape[0]`).

Reading checks more than megatron-core does (it asserts the magic and the version only): every count, length,
pointer and file size must agree, so a truncated or foreign file is refused with its name instead of producing
garbage samples.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from alignflow.errors import ConfigError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8  # 34, as `_IndexReader` computes for `sequences_per_dataset`
DTYPE_CODES: dict[int, type[np.number[Any]]] = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16,
}
FORMAT = "a Megatron indexed dataset (<prefix>.bin + <prefix>.idx, megatron.core.datasets.indexed_dataset)"


def code_of(dtype: npt.DTypeLike) -> int:
    """The `.idx` dtype code of `dtype` (`DType.code_from_dtype`)."""
    wanted = np.dtype(dtype)
    for code, typ in DTYPE_CODES.items():
        if np.dtype(typ) == wanted:
            return code
    raise ConfigError(f"dtype {wanted} has no code in Megatron's indexed dataset (known: "
                      f"{', '.join(np.dtype(t).name for t in DTYPE_CODES.values())})")


def optimal_dtype(vocab_size: int) -> type[np.number[Any]]:
    """megatron-core `DType.optimal_dtype`: uint16 below 65500 ids, else int32 (what preprocess_data.py picks)."""
    return np.uint16 if vocab_size < 65500 else np.int32


def bin_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.bin")


def idx_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.idx")


def write_indexed(prefix: str | Path, documents: Iterable[npt.NDArray[Any]], *,
                  dtype: type[np.number[Any]] = np.uint16) -> tuple[Path, Path]:
    """Write `documents` (one sequence each) as `<prefix>.bin` / `<prefix>.idx`; return both paths.

    Never overwrites: an existing file of either name is an error. Both files are written under temporary names
    in the same directory and renamed once complete, the `.idx` last, so an interrupted write leaves no index
    (and therefore no dataset any reader accepts).
    """
    bin_p, idx_p = bin_path(prefix), idx_path(prefix)
    for p in (bin_p, idx_p):
        if p.exists():
            raise ConfigError(f"{p}: already exists; an indexed dataset is never overwritten (remove it first or "
                              "choose another prefix)")
    bin_p.parent.mkdir(parents=True, exist_ok=True)
    code = code_of(dtype)
    itemsize = np.dtype(dtype).itemsize
    lengths: list[int] = []
    tmp_bin = _tmp(bin_p)
    tmp_idx: str | None = None
    try:
        with open(tmp_bin, "wb") as f:
            for doc in documents:
                arr = np.asarray(doc)
                if arr.ndim != 1:
                    raise ConfigError(f"{prefix}: a document must be a 1-D array of token ids, got shape {arr.shape}")
                if arr.size and (int(arr.min()) < 0 or int(arr.max()) > np.iinfo(dtype).max):  # type: ignore[type-var]
                    raise ConfigError(f"{prefix}: token ids {int(arr.min())}..{int(arr.max())} do not fit "
                                      f"{np.dtype(dtype).name}")
                f.write(np.ascontiguousarray(arr, dtype=dtype).tobytes(order="C"))
                lengths.append(int(arr.size))
        sequence_lengths = np.array(lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        if lengths:
            pointers[1:] = np.cumsum(sequence_lengths[:-1].astype(np.int64) * itemsize)
        document_indices = np.arange(len(lengths) + 1, dtype=np.int64)  # one sequence per document
        tmp_idx = _tmp(idx_p)
        with open(tmp_idx, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", code))
            f.write(struct.pack("<Q", len(lengths)))
            f.write(struct.pack("<Q", len(document_indices)))
            f.write(sequence_lengths.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(document_indices.tobytes(order="C"))
        os.chmod(tmp_bin, 0o644)  # mkstemp makes 0600; a dataset is meant to be shared
        os.chmod(tmp_idx, 0o644)
        os.replace(tmp_bin, bin_p)
        os.replace(tmp_idx, idx_p)
    except BaseException:
        for leftover in (tmp_bin, tmp_idx):
            if leftover is not None:
                Path(leftover).unlink(missing_ok=True)
        raise
    return bin_p, idx_p


def _tmp(path: Path) -> str:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    return name


@dataclass(frozen=True, slots=True)
class IndexedDataset:
    """A read-only, memory-mapped indexed dataset (`megatron.core.datasets.indexed_dataset.IndexedDataset`)."""

    prefix: Path
    dtype: np.dtype[Any]
    sequence_lengths: npt.NDArray[np.int32]
    sequence_pointers: npt.NDArray[np.int64]
    document_indices: npt.NDArray[np.int64]
    tokens: npt.NDArray[Any]  # the whole .bin as one memory-mapped 1-D array

    def __len__(self) -> int:
        return int(self.sequence_lengths.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> npt.NDArray[Any]:
        """Tokens `offset : offset + length` of sequence `idx` (`IndexedDataset.get`)."""
        size = int(self.sequence_lengths[idx])
        if length is None:
            length = size - offset
        start = int(self.sequence_pointers[idx]) // self.dtype.itemsize + offset
        return self.tokens[start:start + length]


def open_indexed(prefix: str | Path, *, where: str) -> IndexedDataset:
    """Open `<prefix>.bin/.idx`, checking that they are one consistent indexed dataset; `where` names the reader."""
    prefix = Path(prefix)
    bin_p, idx_p = bin_path(prefix), idx_path(prefix)
    if prefix.suffix in (".npy", ".bin", ".idx", ".tokens") and not idx_p.exists():
        raise ConfigError(f"{where}: data {str(prefix)!r} names a file, not a prefix: the data must be {FORMAT}; "
                          f"give the prefix (without .bin/.idx) or convert the file with `alignflow data make "
                          f"PREFIX --from-npy {prefix}`")
    missing = [str(p) for p in (idx_p, bin_p) if not p.is_file()]
    if missing:
        raise ConfigError(f"{where}: {' and '.join(missing)} not found: the data must be {FORMAT}; make it with "
                          "`alignflow data make PREFIX --tokens N --seed S`")
    idx_size = idx_p.stat().st_size
    with open(idx_p, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:len(MAGIC)] != MAGIC:
        raise ConfigError(f"{where}: {idx_p} is not an indexed-dataset index (no MMIDIDX header): the data must be "
                          f"{FORMAT}")
    version, = struct.unpack_from("<Q", head, len(MAGIC))
    code, = struct.unpack_from("<B", head, len(MAGIC) + 8)
    count, doc_count = struct.unpack_from("<QQ", head, len(MAGIC) + 9)
    if version != VERSION:
        raise ConfigError(f"{where}: {idx_p}: index version {version}; megatron-core reads version {VERSION}")
    if code not in DTYPE_CODES:
        raise ConfigError(f"{where}: {idx_p}: unknown dtype code {code}")
    expected = HEADER_BYTES + 12 * count + 8 * doc_count
    if idx_size not in (expected, expected + count):  # + int8 modes of a multimodal index
        raise ConfigError(f"{where}: {idx_p} holds {idx_size} bytes; its header ({count} sequences, {doc_count} "
                          f"document indices) needs {expected}: the index is truncated or not Megatron's")
    raw = np.memmap(idx_p, mode="r", dtype=np.uint8)
    lengths = np.frombuffer(raw, dtype=np.int32, count=count, offset=HEADER_BYTES)
    pointers = np.frombuffer(raw, dtype=np.int64, count=count, offset=HEADER_BYTES + 4 * count)
    docs = np.frombuffer(raw, dtype=np.int64, count=doc_count, offset=HEADER_BYTES + 12 * count)
    dtype = np.dtype(DTYPE_CODES[code])
    bin_size = bin_p.stat().st_size
    total = int(lengths.astype(np.int64).sum())
    if bin_size != total * dtype.itemsize:
        raise ConfigError(f"{where}: {bin_p} holds {bin_size} bytes, but {idx_p} describes {total} {dtype.name} "
                          f"tokens ({total * dtype.itemsize} bytes): the two files are not one dataset")
    if count:
        starts = np.concatenate(([0], np.cumsum(lengths[:-1].astype(np.int64)) * dtype.itemsize))
        if (lengths < 0).any() or not np.array_equal(starts, pointers):
            raise ConfigError(f"{where}: {idx_p}: sequence pointers do not follow the sequence lengths")
    if doc_count == 0 or docs[0] != 0 or docs[-1] != count or (np.diff(docs) < 0).any():
        raise ConfigError(f"{where}: {idx_p}: document indices must rise from 0 to the sequence count {count}")
    tokens = np.memmap(bin_p, mode="r", dtype=dtype) if bin_size else np.zeros(0, dtype=dtype)
    return IndexedDataset(prefix, dtype, lengths, pointers, docs, tokens)
