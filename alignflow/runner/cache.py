"""Cache keys and code versions of pipeline steps (ARCHITECTURE §4).

A step's cache key is the sha256 of: the step name, its command and config *templates* (output and input
locations are placeholders, so where a file happens to live does not change the key), the code version of what
runs it, and the sha256 of each declared input. Never an output's hash: that would change the key as soon as the
output exists (orchestration reference G1).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import alignflow

PACKAGE_ROOT = Path(alignflow.__file__).resolve().parent


def cache_key(
    *, step: str, argv: Iterable[str], files: Mapping[str, str], env: Mapping[str, str], code_version: str,
    inputs: Mapping[str, str], extra: Mapping[str, Any] | None = None,
) -> str:
    """The sha256 (hex) that identifies one execution of a step."""
    payload = {
        "step": step,
        "argv": list(argv),
        "files": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in sorted(files.items())},
        "env": dict(sorted(env.items())),
        "code": code_version,
        "inputs": dict(sorted(inputs.items())),
        "extra": extra or {},
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@lru_cache(maxsize=32)
def source_digest(*relative: str) -> str:
    """sha256 over the Python sources (and YAML specs) of parts of the alignflow package.

    Used as the code version of steps that alignflow itself runs (the twin, the converters, the comparison):
    a fix in a module the step uses changes the key even when the step's own function did not change
    (orchestration reference G2).
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
