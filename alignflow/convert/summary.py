"""What a conversion did: the summary every converter returns, and the progress callback it reports through."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from alignflow.errors import ConversionError

# progress(done_bytes, total_bytes): called after each tensor (or rule) with the input bytes processed so far.
ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class ConversionSummary:
    """The record of one conversion; `to_json()` is what `alignflow convert ... --json` prints and the store keeps."""

    kind: Literal["bf16", "megatron", "mindformers"]
    source: str
    destination: str
    iteration: int
    tensors: int  # tensors written (Megatron `_extra_state` placeholders not counted)
    bytes: int  # tensor payload bytes written
    seconds: float
    output_files: tuple[str, ...]  # relative to destination
    dropped: tuple[str, ...] = ()  # source keys left out on purpose (optimizer state, counters, spec `ignore`)
    dtypes: tuple[tuple[str, int], ...] = ()  # dtype -> number of tensors written
    spec: str | None = None
    flavor: str | None = None
    megatron_version: str | None = None
    extra_state_keys: int = 0
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["dtypes"] = dict(self.dtypes)
        for key in ("output_files", "dropped", "notes"):
            out[key] = list(out[key])
        return out


def dtype_counts(dtypes: list[str]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for d in dtypes:
        counts[d] = counts.get(d, 0) + 1
    return tuple(sorted(counts.items()))


@contextmanager
def staged_output(dst: Path) -> Iterator[Path]:
    """A temporary directory next to `dst` that becomes `dst` only if the block finishes.

    Conversions must leave nothing behind on failure and never overwrite (issue 4): the output is built in a
    hidden sibling directory (same filesystem, so the final rename is atomic) and renamed last; any exception
    removes it. An existing `dst` is refused up front.
    """
    dst = Path(dst)
    if dst.exists() or dst.is_symlink():
        raise ConversionError([f"{dst}: already exists; remove it or choose another destination"],
                              header="refusing to overwrite")
    parent = dst.parent if str(dst.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".partial", dir=parent))
    tmp.chmod(0o755)  # mkdtemp makes it 0700; the result is an ordinary checkpoint directory
    try:
        yield tmp
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
