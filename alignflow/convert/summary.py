"""What a conversion did: the summary every converter returns, and the progress callback it reports through."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from alignflow.errors import ConversionError

log = logging.getLogger(__name__)

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
    hidden sibling directory `.<name>.XXXXXXXX.partial` (same filesystem, so the final rename is atomic) and
    renamed last; any exception removes it. An existing `dst` is refused up front.

    A process killed with SIGKILL cannot remove its staging directory, so each one is held under an exclusive
    `flock` while its conversion runs, and the next conversion to the same `dst` removes every sibling staging
    directory of `dst` that nobody holds (issue 16): a crash costs disk space until the next attempt, never
    forever, and a conversion still running elsewhere is never touched.
    """
    dst = Path(dst)
    if dst.exists() or dst.is_symlink():
        raise ConversionError([f"{dst}: already exists; remove it or choose another destination"],
                              header="refusing to overwrite")
    parent = dst.parent if str(dst.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(parent, dst.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=STAGING_SUFFIX, dir=parent))
    held = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the result is an ordinary checkpoint directory
        try:
            yield tmp
            os.replace(tmp, dst)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        os.close(held)


STAGING_SUFFIX = ".partial"


def remove_stale_staging(parent: Path, name: str) -> list[Path]:
    """Remove the staging directories of conversions to `parent/name` that died; the ones removed.

    Only names that `staged_output` makes for exactly this destination (`.<name>.` + mkdtemp's 8 characters +
    `.partial`) are candidates, and only those whose flock can be taken: a live conversion holds its own.
    """
    pattern = re.compile(rf"^\.{re.escape(name)}\.[a-z0-9_]{{8}}{re.escape(STAGING_SUFFIX)}$")
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(parent) if pattern.match(e.name)]
    except OSError:
        return removed
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a conversion is running there
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
            log.info("removed %s, left by a conversion to %s that did not finish", entry.path, parent / name)
        finally:
            os.close(fd)
    return removed
