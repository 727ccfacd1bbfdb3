"""SHA256 fingerprints of files and directories, memoized on (path, dev, inode, size, mtime_ns, ctime_ns).

A directory's fingerprint is the sha256 of its canonical manifest: the JSON list of `[relative path, sha256,
size]` for every regular file below it, sorted by path (POSIX separators). So the digest is independent of
file-creation order and changes with any byte, any rename and any added or removed file. Symbolic links are
followed (a checkpoint is what a reader of the directory sees); a dangling link, a link loop or a special file
(FIFO, socket, device) is an error rather than something silently left out of the digest. With a confinement
root (`--confine DIR`, what the transports pass: the host's workdir), a link anywhere below a path that resolves
outside DIR is refused before anything is read (`PathEscape`, exit status 97 and an `alignflow-escape` line):
a checkpoint holding `leak -> ~/.ssh/id_ed25519` is never hashed, and so never copied (issue 16).

Runnable on any host with nothing but the standard library, which is how the transports hash artifacts where
they live (checkpoints never cross the network to be hashed):

    python -m alignflow.fingerprint PATH... --json [--manifest] [--memo FILE | --no-memo] [--confine DIR]
                                   [--walk-only]
    -> {"PATH": "<sha256 hex>", ...}                       (--json)
    -> {"PATH": {"kind": "file"|"dir", "sha256": ..., "size": ..., "files": [[rel, sha256, size], ...]}}
                                                           (--json --manifest; "files" only for directories)
    exit status 1 when any path could not be hashed (one `WHERE: reason` line each on stderr; the others are
    still printed); 97 when a path leaves the confinement root (nothing printed on stdout). `--walk-only` reads
    no file: it only checks that every path is confined (copies whose fingerprint is already known).

Why memoize: a cache key of a pipeline step includes the sha256 of its inputs; without a memo, every run would
re-read multi-GB checkpoints (docs/architecture.md#records-caching-and-re-runs,
docs/orchestration.md#stat-memoized-hashing). The memo is a small SQLite file
keyed like DVC's state DB, plus git's "racy clean" rule: an entry whose file was modified less than
`RACY_WINDOW_NS` before it was hashed is not trusted, because a same-size rewrite inside one timestamp tick
(1 s on Lustre and some NFS servers) would leave every stat field unchanged.

Why this reads files the way it does (measured by `benchmarks/bench_fingerprint.py`): a 4 MiB `readinto`
buffer and `POSIX_FADV_SEQUENTIAL` keep one stream as fast as `openssl dgst`; hashlib releases the GIL on
large updates, so a thread pool hashes several files on several cores; the largest files are started first so
that one big shard does not end up alone on one core at the end.

(Longer than the usual 400 lines on purpose: the transports send this one file to every host, whose Python runs
it with nothing but the standard library, so the walk, the memo and the confinement cannot live in other modules.)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sqlite3
import stat as stat_module
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

BUFFER_BYTES = 4 * 1024 * 1024
MEMO_ENV = "ALIGNFLOW_HASH_MEMO"
# A memo entry is trusted only if the file's mtime was at least this much older than the moment it was hashed.
RACY_WINDOW_NS = 2_000_000_000
_MEMO_SCHEMA_VERSION = 3  # 3: the `checked` table


# How a confinement failure is reported to the transports (alignflow.transport.paths reads these).
ESCAPE_EXIT = 97
ESCAPE_MARK = "alignflow-escape"


class FileChangedError(OSError):
    """A file changed (size, mtime or ctime) while it was being hashed: its digest would describe no real state."""


class PathEscape(OSError):
    """A path, or a symbolic link below it, resolves outside the confinement root."""

    def __init__(self, path: str, real: str) -> None:
        super().__init__(f"{path}: resolves to {real}, outside the confinement root")
        self.path, self.real = path, real

    def report(self) -> str:
        """The stderr line the transports turn into `PathNotAllowed`."""
        return f"{ESCAPE_MARK}\t{self.path}\t{self.real}"


def _check_inside(path: str, real: str, root: str | None) -> None:
    if root is not None and real != root and not real.startswith(root.rstrip("/") + "/"):
        raise PathEscape(path, real)


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
        if hasattr(os, "posix_fadvise"):
            # Doubles the kernel's read-ahead on Linux; a hint only, so any failure is irrelevant.
            with contextlib.suppress(OSError):
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
    return digest.hexdigest()


def canonical_manifest(files: Iterable[FileEntry]) -> bytes:
    """The bytes whose sha256 is a directory's digest.

    Names that are not valid UTF-8 keep their raw bytes (surrogateescape), so every name has one encoding.
    """
    rows = sorted(([f.path, f.sha256, f.size] for f in files), key=lambda r: str(r[0]))
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape")


def stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What says a file is unchanged: device, inode, size, mtime and ctime (ns)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class HashMemo:
    """`(path, dev, inode, size, mtime_ns, ctime_ns) -> sha256`, persisted in SQLite; safe across threads and
    processes (WAL, 30 s busy timeout).

    It is a cache: an older memo layout is dropped and rebuilt, and losing the last entries on a power cut only
    costs a re-hash (hence `synchronous=NORMAL`).
    """

    def __init__(self, db_path: str | Path) -> None:
        self.db_path = Path(db_path).expanduser()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.db_path, timeout=30, check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            if conn.execute("PRAGMA user_version").fetchone()[0] != _MEMO_SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                if conn.execute("PRAGMA user_version").fetchone()[0] != _MEMO_SCHEMA_VERSION:
                    conn.execute("DROP TABLE IF EXISTS memo")
                    conn.execute("DROP TABLE IF EXISTS checked")
                    conn.execute(
                        "CREATE TABLE memo (path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, size INTEGER,"
                        " mtime_ns INTEGER, ctime_ns INTEGER, hashed_at_ns INTEGER, sha256 TEXT NOT NULL)"
                    )
                    conn.execute("CREATE TABLE checked (what TEXT PRIMARY KEY, checked_at_ns INTEGER)")
                    conn.execute(f"PRAGMA user_version={_MEMO_SCHEMA_VERSION}")
                conn.execute("COMMIT")
            self._conn = conn
        return self._conn

    def get(self, path: str, st: os.stat_result) -> str | None:
        """The memoized digest of `path` if its stat still matches and the entry is not racy, else None."""
        return self.get_many([(path, st)]).get(path)

    def get_many(self, items: Sequence[tuple[str, os.stat_result]]) -> dict[str, str]:
        """`path -> sha256` for every item whose memo entry still matches its stat and is not racy.

        One query per 500 paths: a directory of thousands of small files costs a few queries, not thousands.
        """
        rows: list[tuple[Any, ...]] = []
        paths = list(dict.fromkeys(p for p, _ in items))
        with self._lock:
            conn = self._connect()
            for i in range(0, len(paths), 500):
                chunk = paths[i:i + 500]
                rows += conn.execute(
                    "SELECT path, dev, ino, size, mtime_ns, ctime_ns, hashed_at_ns, sha256 FROM memo"
                    f" WHERE path IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall()
        stats = dict(items)
        hits: dict[str, str] = {}
        for path, *key, hashed_at_ns, sha256 in rows:
            st = stats[path]
            # Not trusted if hashed too soon after its last write: a same-tick rewrite would be invisible.
            if tuple(key) == stat_key(st) and int(hashed_at_ns) - st.st_mtime_ns >= RACY_WINDOW_NS:
                hits[path] = str(sha256)
        return hits

    def put_many(self, rows: Sequence[tuple[str, os.stat_result, str, int]]) -> None:
        """Remember many `(path, stat, sha256, hashed_at_ns)` in one transaction (one fsync, not one per file)."""
        if not rows:
            return
        values = [(p, *stat_key(st), at, digest) for p, st, digest, at in rows]
        with self._lock:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR REPLACE INTO memo VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def checked(self, what: str) -> bool:
        """Whether `mark_checked(what)` was called: a check of content named by its sha256 (`what` holds it) passed
        once, so it passes again (the data directory's structure, `alignflow.runner.session.prepare_data`)."""
        with self._lock:
            row = self._connect().execute("SELECT 1 FROM checked WHERE what = ?", (what,)).fetchone()
        return row is not None

    def mark_checked(self, what: str) -> None:
        with self._lock:
            self._connect().execute("INSERT OR REPLACE INTO checked VALUES (?, ?)", (what, time.time_ns()))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class Fingerprinter:
    """Hashes files and directories; directory files in parallel across cores; memoized when given a memo.

    `hashed_bytes` counts the bytes actually read (memo misses), which is how tests prove a memo hit and the
    benchmark reports throughput.
    """

    def __init__(self, memo: HashMemo | None = None, *, workers: int | None = None,
                 confine: str | Path | None = None) -> None:
        self.memo = memo
        self.workers = workers or _default_workers()
        # Links are followed only where they stay under this root (its real path); see the module docstring.
        self.confine = os.path.realpath(confine) if confine is not None else None
        self.hashed_bytes = 0
        self.hashed_files = 0
        self._count_lock = threading.Lock()

    def file(self, path: str | Path) -> str:
        """sha256 of one file (memo first)."""
        return self._single(path)[0]

    def _single(self, path: str | Path) -> tuple[str, int]:
        """(sha256, size) of one file, both from the same stat."""
        real, st = _regular_file(path, self.confine)
        if self.memo is not None:
            hit = self.memo.get(real, st)
            if hit is not None:
                return hit, st.st_size
        pending: list[tuple[str, os.stat_result, str, int]] = []
        digest = self._hash(str(path), real, st, pending)
        if self.memo is not None:
            self.memo.put_many(pending)
        return digest, st.st_size

    def _hash(self, label: str, real: str, st: os.stat_result, pending: list[tuple[str, os.stat_result, str, int]]
              ) -> str:
        """Read and hash one file whose stat is `st`; append its memo row to `pending` (written by the caller)."""
        started_ns = time.time_ns()
        digest = sha256_file_uncached(real)
        if stat_key(os.stat(real)) != stat_key(st):
            raise FileChangedError(f"{label}: changed while being hashed; hash it again once it is written completely")
        with self._count_lock:
            self.hashed_bytes += st.st_size
            self.hashed_files += 1
        pending.append((real, st, digest, started_ns))  # list.append is atomic: safe from pool threads
        return digest

    def check(self, path: str | Path) -> None:
        """Walk `path` as `fingerprint` would, reading no file: `PathEscape` if it leaves the confinement root."""
        p = Path(path)
        _check_inside(str(p), os.path.realpath(p), self.confine)
        if p.is_dir():
            _list_files(p, self.confine)

    def fingerprint(self, path: str | Path) -> Fingerprint:
        """Fingerprint of a file or a directory (manifest included for directories)."""
        p = Path(path)
        _check_inside(str(p), os.path.realpath(p), self.confine)
        if p.is_dir():
            return self._directory(p)
        if not p.exists():
            if p.is_symlink():
                raise FileNotFoundError(f"{p}: dangling symbolic link")
            raise FileNotFoundError(f"{p}: no such file or directory")
        digest, size = self._single(p)
        return Fingerprint(kind="file", sha256=digest, size=size)

    def _directory(self, root: Path) -> Fingerprint:
        files: list[tuple[str, str, str, os.stat_result]] = []  # (relative path, label, real path, stat)
        for rel, path in _list_files(root, self.confine):
            real, st = _regular_file(path, self.confine)
            files.append((rel, str(path), real, st))
        hits = self.memo.get_many([(real, st) for _, _, real, st in files]) if self.memo is not None else {}
        # Largest first: with N workers, a big shard started last would run alone on one core.
        unique = {real: (label, st) for _, label, real, st in files if real not in hits}
        todo = sorted(unique.items(), key=lambda item: -item[1][1].st_size)
        pending: list[tuple[str, os.stat_result, str, int]] = []
        try:
            if len(todo) > 1 and self.workers > 1:
                with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
                    digests = list(pool.map(lambda item: self._hash(item[1][0], item[0], item[1][1], pending), todo))
            else:
                digests = [self._hash(label, real, st, pending) for real, (label, st) in todo]
        finally:
            if self.memo is not None:
                self.memo.put_many(pending)  # what was hashed stays memoized even if another file failed
        hits.update({real: d for (real, _), d in zip(todo, digests, strict=True)})
        entries = tuple(sorted((FileEntry(rel, hits[real], st.st_size) for rel, _, real, st in files),
                               key=lambda e: e.path))
        digest = hashlib.sha256(canonical_manifest(entries)).hexdigest()
        return Fingerprint(kind="dir", sha256=digest, size=sum(e.size for e in entries), files=entries)


def _regular_file(path: str | Path, confine: str | None = None) -> tuple[str, os.stat_result]:
    """(real path, stat) of a regular file; the memo is keyed by the real path."""
    real = os.path.realpath(path)
    _check_inside(str(path), real, confine)
    st = os.stat(real)
    if not stat_module.S_ISREG(st.st_mode):
        raise OSError(f"{path}: not a regular file")
    return real, st


def _list_files(root: Path, confine: str | None = None) -> list[tuple[str, Path]]:
    """Every file below `root` as (relative POSIX path, path), following links, refusing loops and odd files, and,
    with `confine`, every link that resolves outside it (before anything behind the link is looked at)."""
    out: list[tuple[str, Path]] = []

    def walk(directory: Path, rel: str, ancestors: frozenset[tuple[int, int]]) -> None:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            relpath = f"{rel}{entry.name}"
            full = Path(entry.path)
            if entry.is_symlink():
                _check_inside(entry.path, os.path.realpath(entry.path), confine)
            if entry.is_dir(follow_symlinks=True):
                st = full.stat()
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    raise OSError(f"{full}: symbolic link loop (points at one of its parent directories)")
                walk(full, relpath + "/", ancestors | {key})
            elif entry.is_file(follow_symlinks=True):
                out.append((relpath, full))
            elif entry.is_symlink() and not full.exists():
                raise FileNotFoundError(f"{full}: dangling symbolic link")
            else:
                raise OSError(f"{full}: not a regular file or directory (FIFO, socket or device)")

    st = root.stat()
    walk(root, "", frozenset({(st.st_dev, st.st_ino)}))
    return out


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


def fingerprint_paths(
    paths: Sequence[str], fingerprinter: Fingerprinter
) -> tuple[dict[str, Fingerprint], dict[str, str]]:
    """Fingerprints of several paths, in order, and a `path -> "WHERE: what happened"` map of those that failed."""
    results: dict[str, Fingerprint] = {}
    errors: dict[str, str] = {}
    for path in paths:
        try:
            results[path] = fingerprinter.fingerprint(path)
        except PathEscape:
            raise
        except OSError as exc:
            errors[path] = f"{exc.filename}: {exc.strerror}" if exc.strerror and exc.filename else str(exc)
    return results, errors


def hash_report(paths: Sequence[str], *, as_json: bool, manifest: bool, memo_path: str | Path | None,
                use_memo: bool, confine: str | None = None) -> tuple[str, list[str]]:
    """What `python -m alignflow.fingerprint` and `alignflow hash` print: (stdout text, one line per failed path).

    `--json` is `{"<path>": "<sha256>"}` (a directory's value is its manifest digest), or with `manifest` each
    path's full fingerprint; otherwise `sha256  path` lines, as sha256sum prints them. `PathEscape` (raised, not
    listed) when a path leaves `confine`.
    """
    memo = HashMemo(memo_path or default_memo_path()) if use_memo else None
    try:
        results, errors = fingerprint_paths(paths, Fingerprinter(memo, confine=confine))
    finally:
        if memo is not None:
            memo.close()
    if as_json:
        payload = {p: (fp.to_json() if manifest else fp.sha256) for p, fp in results.items()}
        text = json.dumps(payload, indent=None if manifest else 2) + "\n"
    else:
        text = "".join(f"{fp.sha256}  {path}\n" for path, fp in results.items())
    return text, list(errors.values())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignflow.fingerprint", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="files or directories")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--manifest", action="store_true", help="with --json: full fingerprints with manifests")
    parser.add_argument("--memo", help="memo database (default $ALIGNFLOW_HASH_MEMO or ~/.cache/alignflow/...)")
    parser.add_argument("--no-memo", action="store_true", help="always read every byte")
    parser.add_argument("--confine", help="refuse (exit 97) any path or link below it that resolves outside DIR")
    parser.add_argument("--walk-only", action="store_true", help="read nothing; only check --confine")
    args = parser.parse_args(argv)
    try:
        if args.walk_only:
            checker = Fingerprinter(None, confine=args.confine)
            for path in args.paths:
                checker.check(path)
            return 0
        text, errors = hash_report(args.paths, as_json=args.json, manifest=args.manifest, memo_path=args.memo,
                                   use_memo=not args.no_memo, confine=args.confine)
    except PathEscape as exc:
        print(exc.report(), file=sys.stderr)  # noqa: T201 - a CLI entry point
        return ESCAPE_EXIT
    except OSError as exc:  # --walk-only: a dangling link or a loop
        print(str(exc), file=sys.stderr)  # noqa: T201 - a CLI entry point
        return 1
    for reason in errors:
        print(f"error: {reason}", file=sys.stderr)  # noqa: T201 - a CLI entry point
    sys.stdout.write(text)
    return 1 if errors else 0

if __name__ == "__main__":
    sys.exit(main())
