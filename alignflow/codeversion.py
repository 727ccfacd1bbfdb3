"""Code versions: what part of a step's cache key says which code ran it
(docs/architecture.md#records-caching-and-re-runs).

alignflow's own steps (the twin, the converters, the comparison) are versioned by a digest of the sources they
use; a framework checkout on a host (MindFormers, Megatron-LM) by its git commit from the host snapshot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import alignflow

PACKAGE_ROOT = Path(alignflow.__file__).resolve().parent


@lru_cache(maxsize=32)
def source_digest(*relative: str) -> str:
    """sha256 over the Python sources (and YAML specs) of parts of the alignflow package.

    Used as the code version of steps that alignflow itself runs (the twin, the converters, the comparison):
    a fix in a module the step uses changes the key even when the step's own function did not change
    (docs/orchestration.md#g2-an-explicit-code-version-in-the-key).
    """
    digest = hashlib.sha256()
    for rel in relative:
        root = PACKAGE_ROOT / rel
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in {".py", ".yaml"})
        for path in files:
            digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def alignflow_version() -> str:
    return getattr(alignflow, "__version__", "0")


def code_version_for(parts: Iterable[str], *, salt: str = "") -> str:
    """`alignflow <version>+src.<digest>` of the given package parts (plus an optional salt, e.g. a spec text)."""
    parts = tuple(parts)
    digest = source_digest(*parts)
    if salt:
        digest = hashlib.sha256((digest + salt).encode()).hexdigest()
    return f"alignflow {alignflow_version()}+src.{digest[:16]}"


def repo_version(snapshot: Mapping[str, Any] | None, repo: str) -> str:
    """Code version of a framework checkout from a host snapshot: `<commit>[+dirty.<diff digest>]` or `unknown`."""
    if not snapshot:
        return "unknown"
    info = (snapshot.get("repos") or {}).get(repo)
    if not isinstance(info, Mapping) or not info.get("commit"):
        return "unknown"
    version = str(info["commit"])
    if info.get("dirty"):
        version += "+dirty" + (f".{str(info['diff_sha256'])[:12]}" if info.get("diff_sha256") else "")
    return version
