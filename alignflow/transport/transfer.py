"""Verified copies between two hosts' files (`copy_files`; `Transport.put`/`get`/`receive` and `copy_between` use
it, with the controller's own filesystem as one end for put and get).

Every copy follows the same five steps, whatever the route:
1. the sha256 of the source is computed ON the source host (or taken from `expected`, the fingerprint the
   store recorded when the artifact was produced - then the source is not re-read);
2. if the destination already holds identical content, nothing moves (re-running a step is free);
3. the bytes go to a staging name in the destination's directory (`.af-partial-...`);
4. the destination host hashes the staged copy and compares it with step 1: a file that changed between
   hashing and copying, or was corrupted on the way, is refused here and the staged copy deleted (a
   directory is hashed file by file while it arrives, see follow_hash.py, so this costs little extra time);
5. only then is the staged copy renamed to its final name, without replacing anything that appeared
   meanwhile. So a partial or wrong copy never sits at the final path.

Around all five, the destination's host lock (`locks.host_lock`, one per destination path, shared by every
controller): a second copy to the same place waits, then adopts the first's verified copy in step 2. Holding
it, the copy also removes the staging directories that killed copies to the same destination left behind
(only a dead copy's can be there while the lock is held). A source directory is sent only if no link below it
leaves the source host's workdir: hashing it checks that (fingerprint.py --confine), and so does a walk that
reads nothing when its fingerprint was recorded earlier (issue 16). rsync then dereferences (-L) only links
that stay inside; one swapped for an escaping link between that check and the copy would change the bytes,
and the destination's check in step 4 refuses them.

How the bytes move (rsync, rsync run on the source host, a tar stream through the controller or through the two
shells) is the route's, chosen from the two ends (routes.py); the five steps are the same for every route.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

from alignflow.errors import FingerprintMismatch, PathExists
from alignflow.fingerprint import Fingerprint
from alignflow.transport.files import Files
from alignflow.transport.locks import host_lock
from alignflow.transport.results import ProgressFn
from alignflow.transport.routes import Route, Sender, sender_for

log = logging.getLogger(__name__)

STAGING_PREFIX = ".af-partial-"
_LOG_EVERY_S = 10.0


def copy_files(
    src: Files,
    src_path: str,
    dst: Files,
    dst_path: str,
    *,
    progress: ProgressFn | None = None,
    expected: Fingerprint | None = None,
    overwrite: bool = False,
    route: Route = "auto",
) -> Fingerprint:
    """Copy a file or directory from one host to another; returns the destination's verified fingerprint.

    `expected`: the source's fingerprint as recorded earlier; the copy must deliver exactly those bytes.
    `overwrite`: replace different content at `dst_path` (else `PathExists`). `route` (SSH -> SSH only):
    "auto" tries direct, then relay; "direct"/"relay" force one.
    """
    s_path, d_final = src.path(src_path), dst.path(dst_path)
    with host_lock(dst, f"copy:{d_final}", what=f"copy to {d_final}"):
        _remove_stale_staging(dst, d_final)
        return _copy_locked(src, s_path, dst, d_final, progress=progress, expected=expected, overwrite=overwrite,
                            route=route)


def _staging_stem(final: str) -> str:
    """The part of a staging name that only copies to `final` share: its name (cut to 40) and a digest of it."""
    base = posixpath.basename(final)
    return f"{STAGING_PREFIX}{base[:40]}-{hashlib.sha256(base.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"


def _remove_stale_staging(dst: Files, final: str) -> None:
    raw = dst.op("clean_staging", final, _staging_stem(final))
    if raw.exit_code != 0:
        log.warning("%s: could not remove stale staging beside %s: %s", dst.host.name, final,
                    raw.text("stderr").strip())
    for gone in filter(None, raw.stdout.split(b"\0")):
        log.info("%s: removed %s, left by a copy to %s that did not finish", dst.host.name,
                 gone.decode("utf-8", "replace"), final)


def _copy_locked(src: Files, s_path: str, dst: Files, d_final: str, *, progress: ProgressFn | None,
                 expected: Fingerprint | None, overwrite: bool, route: Route) -> Fingerprint:
    want, have = _both_ends(src, s_path, dst, d_final, expected)
    name = f"{src.host.name}:{s_path} -> {dst.host.name}:{d_final}"
    if have is not None:
        if (have.kind, have.sha256) == (want.kind, want.sha256):
            log.info("%s: already there (sha256 %s), nothing copied", name, want.sha256[:12])
            return have
        if not overwrite:
            raise PathExists(f"{d_final} exists with different content (sha256 {have.sha256[:12]}, copy has "
                             f"{want.sha256[:12]}); nothing was overwritten - pass overwrite=True to replace it",
                             path=d_final, host=dst.host.name)
    start = time.perf_counter()
    got = _stage_verify_place(src, s_path, dst, d_final, want, sender_for(src, dst, route),
                              _Reporter(name, want.size, progress), overwrite=overwrite)
    elapsed = time.perf_counter() - start
    log.info("%s: %d bytes in %.2f s (%.1f MB/s), sha256 %s verified on %s", name, want.size, elapsed,
             want.size / max(elapsed, 1e-9) / 1e6, want.sha256[:12], dst.host.name)
    return got


def _both_ends(src: Files, s_path: str, dst: Files, d_final: str,
               expected: Fingerprint | None) -> tuple[Fingerprint, Fingerprint | None]:
    """What the copy must deliver (the source's fingerprint, computed there unless `expected` was recorded), and
    what the destination holds already (None: nothing)."""
    if expected is not None:
        src.check_confined([s_path])  # the hash that would have checked it is not computed again
        want, exists = expected, dst.stat(d_final) is not None
    else:
        with ThreadPoolExecutor(max_workers=1) as pool:  # hash the source while the destination is looked at
            hashing = pool.submit(src.sha256, [s_path])
            exists = dst.stat(d_final) is not None
            want = hashing.result()[s_path]
    return want, (dst.sha256([d_final])[d_final] if exists else None)


def _stage_verify_place(src: Files, s_path: str, dst: Files, d_final: str, want: Fingerprint, sender: Sender,
                        progress: ProgressFn, *, overwrite: bool) -> Fingerprint:
    """Send to a staging dir beside `d_final`, hash what arrived on the destination, rename it into place only if it
    is what the source holds; the staging dir is removed whatever happens."""
    staging = posixpath.join(posixpath.dirname(d_final), f"{_staging_stem(d_final)}-{secrets.token_hex(4)}")
    dst.mkdir(staging)
    staged = posixpath.join(staging, "payload")
    placed = False
    try:
        # A directory is hashed on the destination while it arrives (file by file, as each is complete);
        # a single file can only be hashed once it is all there.
        follower = dst.follow_sha256(staged) if want.kind == "dir" else None
        try:
            sender(src, s_path, dst, staging, want, progress)
        except BaseException:
            if follower is not None:
                follower.abort()
            raise
        got = follower.result() if follower is not None else dst.sha256([staged], memo=False)[staged]
        if (got.kind, got.sha256) != (want.kind, want.sha256):
            raise FingerprintMismatch(
                f"{dst.host.name}: copy of {src.host.name}:{s_path} refused - the bytes that arrived do not match "
                f"the sha256 computed on the source (changed between hashing and copying, or corrupted on the way)"
                f": expected {want.sha256[:16]}, got {got.sha256[:16]}{_diff(want, got)}; nothing was written to "
                f"{d_final}",
                expected=want.sha256,
                actual=got.sha256,
            )
        _place(dst, staged, d_final, overwrite=overwrite)  # also removes the emptied staging dir
        placed = True
    finally:
        if not placed:
            try:
                dst.remove(staging, recursive=True)
            except Exception as exc:  # cleanup must not mask the copy's own error
                log.warning("%s: could not remove staging dir %s: %s", dst.host.name, staging, exc)
    return got


def _place(dst: Files, staged: str, final: str, *, overwrite: bool) -> None:
    raw = dst.op("place", staged, final, "1" if overwrite else "0")
    if raw.exit_code == 6:
        raise PathExists(f"{final} appeared while the copy was running; nothing was overwritten",
                         path=final, host=dst.host.name)
    if raw.exit_code != 0:
        raise dst.failed("place", final, raw)


def _diff(want: Fingerprint, got: Fingerprint) -> str:
    if want.kind != got.kind:
        return f" (a {want.kind} became a {got.kind})"
    a = {f.path: f.sha256 for f in want.files}
    b = {f.path: f.sha256 for f in got.files}
    bad = sorted(p for p in a.keys() | b.keys() if a.get(p) != b.get(p))
    if not bad:
        return ""
    shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
    return f" (differing files: {shown})"


class _Reporter:
    """Progress to the caller's callback, and a log line every 10 s for long copies."""

    def __init__(self, name: str, total: int, callback: ProgressFn | None) -> None:
        self.name, self.total, self.callback = name, total, callback
        self.start = self.last_log = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if self.callback is not None:
            self.callback(done, total)
        now = time.monotonic()
        if now - self.last_log >= _LOG_EVERY_S:
            self.last_log = now
            rate = done / max(now - self.start, 1e-9) / 1e6
            log.info("%s: %.0f%% (%d of %d bytes, %.1f MB/s)", self.name, 100 * done / max(total, 1), done, total,
                     rate)
