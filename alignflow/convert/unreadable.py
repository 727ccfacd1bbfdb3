"""Checkpoint readers fail closed: a damaged file is one `ConversionError` naming it, never a library's traceback.

What the libraries raise on a truncated, emptied or garbled file is anything but theirs alone: `torch.load` an
`EOFError` (an empty file: typer then printed "Aborted."), a `RuntimeError` from its zip reader or a
`pickle.UnpicklingError`; DCP's storage reader a `ValueError: negative seek value` (a truncated `.distcp`, issue 45),
a `FileNotFoundError` for a missing shard. `reading(file)` turns them into the conversion's error at the call that
reads the file, so the message names that file; `storage_problems` finds, before anything is read, the shards of a
DCP / torch_dist checkpoint that its `.metadata` needs and that are missing or shorter than it says.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alignflow.convert.tensor_io import SafetensorsFileError
from alignflow.errors import ConversionError

# What reading a damaged file raises (json.JSONDecodeError and UnicodeDecodeError are ValueErrors).
UNREADABLE: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, RuntimeError, pickle.UnpicklingError)


def unreadable(file: Path | str, exc: BaseException) -> str:
    """One line: the file, and what its library said of it."""
    if isinstance(exc, SafetensorsFileError):
        return str(exc)
    said = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{file}: cannot be read ({type(exc).__name__}{': ' + said if said else ''})"


@contextmanager
def reading(file: Path | str, *, header: str, also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Read `file` inside: what a damaged file raises becomes a `ConversionError` naming it (nothing is written:
    every converter stages its output). `also`: a library's own error classes (DCP's `CheckpointException`, which
    is a BaseException)."""
    try:
        yield
    except (*UNREADABLE, *also) as exc:
        raise ConversionError([unreadable(file, exc)], header=header) from None


def storage_problems(directory: Path, metadata: Any) -> list[str]:
    """The `.distcp` files `metadata` (a DCP `Metadata`) stores data in that are missing, or shorter than the
    bytes it places in them: found before any tensor is read, for every file (one the conversion does not read
    too: the checkpoint is incomplete)."""
    ends: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = str(info.relative_path)
        ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
    problems = []
    for name, end in sorted(ends.items()):
        file = directory / name
        if not file.is_file():
            problems.append(f"{file}: missing (its .metadata stores data in it)")
        elif (size := file.stat().st_size) < end:
            problems.append(f"{file}: truncated: {size} bytes, its .metadata stores data up to byte {end}")
    return problems


def zip_problem(raw: bytes) -> str | None:
    """Why the bytes of one `torch.save` (its zip format: what megatron-core stores for each tensor chunk and sharded
    object of a torch_dist checkpoint, through DCP's writer) are not a whole archive or fail their CRC-32s, or None:
    the one check that sees bytes changed inside a stored tensor."""
    if not raw.startswith(b"PK\x03\x04"):
        return f"not a torch.save archive (it starts {raw[:8]!r})"
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"not a whole torch.save archive ({exc})"
    return f"member {bad!r} fails its CRC-32 (garbled)" if bad is not None else None
