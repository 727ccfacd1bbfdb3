"""Destination-side verification that runs WHILE a copy arrives: hash each file as soon as it is complete.

Run on the destination host by its Python as `python -c <this file> ROOT <source of alignflow/fingerprint.py>`
(standard library only). Until its stdin reaches end-of-file it hashes every regular file under ROOT whose name
does not start with "." (rsync writes each file under a temporary ".name.XXXXXX" and renames it when it is
complete) and that has not changed between two polls (a file written in place, as tar does, is left until it
stops growing). At end-of-file (the transfer has ended) it re-stats everything, re-hashes whatever is new or changed
since it was hashed (size, mtime, ctime, inode), and prints ROOT's fingerprint as JSON exactly as
`python -m alignflow.fingerprint ROOT --json --manifest` would. "abort" on stdin stops it at once.

Why: hashing a 1 GiB checkpoint after the copy costs ~0.5-1 s on top of a ~3-7 s loopback copy; overlapped
with the copy, only the last file's hash is left at the end. The final stat check keeps it exact: a file hashed
while still being written has changed size or times by the end and is hashed again.
"""

from __future__ import annotations  # the host's Python may be older than the controller's

import hashlib
import json
import os
import select
import stat
import sys
import types

_POLL_S = 0.2


def _load_fingerprint(source: str) -> types.ModuleType:
    module = types.ModuleType("alignflow_fingerprint_shipped")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, "alignflow/fingerprint.py", "exec"), module.__dict__)
    return module


class Follower:
    def __init__(self, root: str, fp: types.ModuleType) -> None:
        self.root, self.fp = root, fp
        self.hashed: dict[str, tuple[tuple[int, int, int, int, int], str]] = {}
        self.last_seen: dict[str, tuple[int, int, int, int, int]] = {}

    def _files(self, final: bool) -> list[str]:
        if os.path.isfile(self.root):
            return [self.root]
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            out += [os.path.join(dirpath, n) for n in sorted(filenames) if final or not n.startswith(".")]
        return out

    def scan(self, final: bool) -> bool:
        """Hash what is new or changed; True if anything was hashed."""
        progressed = False
        for path in self._files(final):
            try:
                # lstat: a copy's staging holds content only (rsync -L, tar -h); a link there was not sent by
                # alignflow and is never followed (issue 16)
                before = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(before.st_mode):
                if final:
                    kind = "a symbolic link" if stat.S_ISLNK(before.st_mode) else "not a regular file"
                    raise OSError(f"{path}: {kind} in a staged copy")
                continue
            key = self.fp.stat_key(before)
            known = self.hashed.get(path)
            if known is not None and known[0] == key:
                continue
            if not final and self.last_seen.get(path) != key:
                # Not yet seen unchanged across one poll: a file still being written in place (tar, cp)
                # would otherwise be hashed again and again as it grows.
                self.last_seen[path] = key
                continue
            digest = self.fp.sha256_file_uncached(path)
            if self.fp.stat_key(os.lstat(path)) == key:  # else it changed while read: next scan
                self.hashed[path] = (key, digest)
                progressed = True
        return progressed

    def fingerprint(self) -> dict[str, object]:
        while True:  # a final scan that hashed nothing has seen every file stable
            if not self.scan(final=True):
                break
        if os.path.isfile(self.root):
            st = os.stat(self.root)
            return {"kind": "file", "sha256": self.hashed[self.root][1], "size": st.st_size}
        entries = []
        for path in self._files(final=True):
            rel = os.path.relpath(path, self.root).replace(os.sep, "/")
            entries.append(self.fp.FileEntry(rel, self.hashed[path][1], os.stat(path).st_size))
        entries.sort(key=lambda e: e.path)
        digest = hashlib.sha256(self.fp.canonical_manifest(entries)).hexdigest()
        result = self.fp.Fingerprint(kind="dir", sha256=digest, size=sum(e.size for e in entries),
                                     files=tuple(entries))
        return dict(result.to_json())


def main(root: str, fingerprint_source: str) -> int:
    follower = Follower(root, _load_fingerprint(fingerprint_source))
    stdin = sys.stdin.fileno()
    while True:
        busy = os.path.exists(root) and follower.scan(final=False)
        ready, _, _ = select.select([stdin], [], [], 0 if busy else _POLL_S)
        if ready:
            data = os.read(stdin, 4096)
            if b"abort" in data:
                return 3
            if not data:
                break
    if not os.path.exists(root):
        sys.stderr.write(f"{root}: nothing arrived\n")
        return 2
    json.dump(follower.fingerprint(), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
