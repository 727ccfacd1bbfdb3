"""Confinement of host paths to the host's workdir.

Two checks, because each catches what the other cannot:
- lexical, on the controller (`confine`): relative paths are taken from the workdir, `~` is the host user's
  home, `..` is resolved textually, and anything that ends up outside the workdir is refused before any
  command is sent;
- on the host (`CONFINE_SH`, run in the same round trip as the operation): `realpath -m` resolves symlinks
  where they live, so a link inside the workdir that points outside it is refused too.

A directory is also confined *below* its top: hashing walks it with `fingerprint.py --confine WORKDIR`, which
refuses any link under it that resolves outside the workdir, and a copy only sends a tree that walk accepted
(issue 16). Removal never follows links (`rm -rf` unlinks a link, never what it points at).
"""

from __future__ import annotations

import posixpath
import re

from alignflow.errors import PathNotAllowed
from alignflow.fingerprint import ESCAPE_EXIT, ESCAPE_MARK

# ESCAPE_EXIT / ESCAPE_MARK: the exit status and stderr marker with which the host-side checks (this module's
# shell function, and the fingerprint's walk below a path) report an escape.
_ESCAPE_LINE = re.compile(rf"^{ESCAPE_MARK}\t(?P<path>.*)\t(?P<real>.*)$", re.MULTILINE)

# Bash function: `af_confine WORKDIR_REAL PATH...` exits ESCAPE_EXIT when a path resolves outside the workdir.
# `af_real PATH` sets AF_REAL to `realpath -m PATH` exactly: `$(...)` alone would strip trailing newlines, which
# a file name may end with.
CONFINE_SH = rf"""af_real() {{
  AF_REAL=$(realpath -m -- "$1" && printf x) || exit 96
  AF_REAL=${{AF_REAL%x}}; AF_REAL=${{AF_REAL%$'\n'}}
}}
af_confine() {{
  local w=${{1%/}} p; shift  # a workdir of "/" (the controller) confines nothing
  for p in "$@"; do
    af_real "$p"
    case "$AF_REAL" in "$w"|"$w"/*) ;; *) printf '{ESCAPE_MARK}\t%s\t%s\n' "$p" "$AF_REAL" >&2; exit {ESCAPE_EXIT};;
    esac
  done
}}
"""


def expand_home(p: str, home: str) -> str:
    """`~` and `~/x` with the host user's home; `~user` is refused (another user's files are never ours)."""
    if p == "~":
        return home
    if p.startswith("~/"):
        return posixpath.join(home, p[2:])
    if p.startswith("~"):
        raise ValueError(f"{p!r}: only '~' and '~/...' are supported, not another user's home")
    return p


def confine(p: str, *, workdir: str, home: str, host: str) -> str:
    """The absolute, normalized form of `p` on the host; `PathNotAllowed` when it is outside `workdir`."""
    if not isinstance(p, str) or not p or "\0" in p:
        raise PathNotAllowed(repr(p), host=host, workdir=workdir)
    try:
        expanded = expand_home(p, home)
    except ValueError:
        raise PathNotAllowed(p, host=host, workdir=workdir) from None
    full = posixpath.normpath(posixpath.join(workdir, expanded))
    if full.startswith("//"):  # POSIX keeps a leading '//'; it is still the root
        full = "/" + full.lstrip("/")
    if full != workdir and not full.startswith(workdir.rstrip("/") + "/"):
        raise PathNotAllowed(p, host=host, workdir=workdir)
    return full


def raise_if_escaped(exit_code: int, stderr: str, *, host: str, workdir: str) -> None:
    """Turn the host-side check's report into `PathNotAllowed`."""
    if exit_code != ESCAPE_EXIT:
        return
    match = _ESCAPE_LINE.search(stderr)
    path = f"{match['path']} (resolves to {match['real']})" if match else "?"
    raise PathNotAllowed(path, host=host, workdir=workdir)
