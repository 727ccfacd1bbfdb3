"""SHA256 fingerprints of files and directories, memoized on (path, size, mtime_ns, inode).

A directory's fingerprint is the sha256 of its canonical manifest: the JSON list of `[relative path, sha256,
size]` for every regular file below it, sorted by path (POSIX separators). So the digest is independent of
file-creation order and changes with any byte, any rename and any added or removed file.

Runnable on any host with nothing but the standard library, which is how the transports hash artifacts where
they live (checkpoints never cross the network to be hashed):

    python -m alignflow.fingerprint PATH... --json [--manifest] [--memo FILE]
    -> {"PATH": "<sha256 hex>", ...}                       (--json)
    -> {"PATH": {"kind": "file"|"dir", "sha256": ..., "size": ..., "files": [[rel, sha256, size], ...]}}
                                                           (--json --manifest; "files" only for directories)

Why memoize: a cache key of a pipeline step includes the sha256 of its inputs; without a memo, every run would
re-read multi-GB checkpoints (ARCHITECTURE §4, orchestration reference §2.6). The memo is a small SQLite file
keyed like DVC's state DB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import sys
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

BUFFER_BYTES = 4 * 1024 * 1024
MEMO_ENV = "ALIGNFLOW_HASH_MEMO"


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a directory manifest."""

    path: str  # relative, POSIX separators
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The fingerprint of a file or a directory."""

    kind: Literal["file", "dir"]
    sha256: str
    size: int
    files: tuple[FileEntry, ...] = field(default=())

    def to_json(self, *, manifest: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "sha256": self.sha256, "size": self.size}
        if manifest and self.kind == "dir":
            out["files"] = [[f.path, f.sha256, f.size] for f in self.files]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        files = tuple(FileEntry(str(p), str(s), int(n)) for p, s, n in data.get("files", []))
        return cls(kind=data["kind"], sha256=data["sha256"], size=int(data["size"]), files=files)


def sha256_file_uncached(path: str | Path, *, buffer_bytes: int = BUFFER_BYTES) -> str:
    """Stream one file through sha256 with a large reusable buffer (hashlib releases the GIL while hashing)."""
    digest = hashlib.sha256()
    buf = bytearray(buffer_bytes)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()


def canonical_manifest(files: Iterable[FileEntry]) -> bytes:
    """The bytes whose sha256 is a directory's digest."""
    rows = sorted(([f.path, f.sha256, f.size] for f in files), key=lambda r: str(r[0]))
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class HashMemo:
    """`(path, dev, inode, size, mtime_ns) -> sha256`, persisted in SQLite; safe across threads and processes."""

    def __init__(self, db_path: str | Path) -> None:
        self.db_path = Path(db_path).expanduser()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.db_path, timeout=30, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS memo (path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, size INTEGER,"
                " mtime_ns INTEGER, sha256 TEXT NOT NULL)"
            )
            self._conn = conn
        return self._conn

    def get(self, path: str, st: os.stat_result) -> str | None:
        with self._lock:
            row = self._connect().execute(
                "SELECT dev, ino, size, mtime_ns, sha256 FROM memo WHERE path = ?", (path,)
            ).fetchone()
        if row and tuple(row[:4]) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns):
            return str(row[4])
        return None

    def put(self, path: str, st: os.stat_result, sha256: str) -> None:
        with self._lock:
            self._connect().execute(
                "INSERT OR REPLACE INTO memo VALUES (?, ?, ?, ?, ?, ?)",
                (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, sha256),
            )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class Fingerprinter:
    """Hashes files and directories; directory files in parallel across cores; memoized when given a memo."""

    def __init__(self, memo: HashMemo | None = None, *, workers: int | None = None) -> None:
        self.memo = memo
        self.workers = workers or max(1, os.cpu_count() or 1)
        self.hashed_bytes = 0  # bytes actually read (memo misses), for benchmarks and tests
        self._count_lock = threading.Lock()

    def file(self, path: str | Path) -> str:
        """sha256 of one file (memo first)."""
        real = os.path.realpath(path)
        st = os.stat(real)
        if self.memo is not None:
            hit = self.memo.get(real, st)
            if hit is not None:
                return hit
        digest = sha256_file_uncached(real)
        with self._count_lock:
            self.hashed_bytes += st.st_size
        # Re-stat: if the file changed while we read it, do not memoize a digest of a moving target.
        if self.memo is not None and os.stat(real).st_mtime_ns == st.st_mtime_ns:
            self.memo.put(real, st, digest)
        return digest

    def fingerprint(self, path: str | Path) -> Fingerprint:
        """Fingerprint of a file or a directory (manifest included for directories)."""
        p = Path(path)
        if p.is_dir():
            return self._directory(p)
        if not p.exists():
            raise FileNotFoundError(f"no such file or directory: {p}")
        return Fingerprint(kind="file", sha256=self.file(p), size=p.stat().st_size)

    def _directory(self, root: Path) -> Fingerprint:
        rels: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if full.is_file():
                    rels.append(full.relative_to(root).as_posix())
        paths = [root / r for r in rels]
        if len(paths) > 1 and self.workers > 1:
            with ThreadPoolExecutor(max_workers=self.workers) as pool:
                digests = list(pool.map(self.file, paths))
        else:
            digests = [self.file(p) for p in paths]
        entries = tuple(FileEntry(r, d, (root / r).stat().st_size) for r, d in zip(rels, digests, strict=True))
        entries = tuple(sorted(entries, key=lambda e: e.path))
        digest = hashlib.sha256(canonical_manifest(entries)).hexdigest()
        return Fingerprint(kind="dir", sha256=digest, size=sum(e.size for e in entries), files=entries)


def default_memo_path() -> Path:
    """Memo location: $ALIGNFLOW_HASH_MEMO, else ~/.cache/alignflow/hashmemo.sqlite (resolved at call time)."""
    env = os.environ.get(MEMO_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "alignflow" / "hashmemo.sqlite"


def fingerprint(path: str | Path, *, memo: HashMemo | None = None) -> Fingerprint:
    """Convenience: the fingerprint of one path."""
    return Fingerprinter(memo).fingerprint(path)


def sha256_of(path: str | Path, *, memo: HashMemo | None = None) -> str:
    """Convenience: the digest of a file, or the manifest digest of a directory."""
    return fingerprint(path, memo=memo).sha256


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignflow.fingerprint", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="files or directories")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--manifest", action="store_true", help="with --json: full fingerprints with manifests")
    parser.add_argument("--memo", help="memo database (default $ALIGNFLOW_HASH_MEMO or ~/.cache/alignflow/...)")
    parser.add_argument("--no-memo", action="store_true", help="always read every byte")
    args = parser.parse_args(argv)
    memo = None if args.no_memo else HashMemo(args.memo or default_memo_path())
    fp = Fingerprinter(memo)
    results: dict[str, Any] = {}
    status = 0
    for path in args.paths:
        try:
            result = fp.fingerprint(path)
        except OSError as exc:
            print(f"{path}: {exc.strerror or exc}", file=sys.stderr)  # noqa: T201 - a CLI entry point
            status = 1
            continue
        results[path] = result.to_json() if args.manifest else result.sha256
    if memo is not None:
        memo.close()
    if args.json:
        print(json.dumps(results, indent=None if args.manifest else 2))  # noqa: T201
    else:
        for path, value in results.items():
            print(f"{value if isinstance(value, str) else value['sha256']}  {path}")  # noqa: T201
    return status


if __name__ == "__main__":
    sys.exit(main())
