"""Cache keys of pipeline steps (docs/architecture.md#records-caching-and-re-runs).

A step's cache key is the sha256 of: the step name, its command and config *templates* (output and input
locations are placeholders, so where a file happens to live does not change the key), the code version of what
runs it, and the sha256 of each declared input. Never an output's hash: that would change the key as soon as the
output exists (docs/orchestration.md#g1-hash-declared-inputs-only).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager


def cache_key(
    *, step: str, argv: Iterable[str], files: Mapping[str, str], env: Mapping[str, str], code_version: str,
    inputs: Mapping[str, str], extra: Mapping[str, object] | None = None,
) -> str:
    """The sha256 (hex) that identifies one execution of a step; `extra`: anything else the execution depends on
    (JSON, with anything else written as its `str`)."""
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


_guard = threading.Lock()
_executing: dict[str, threading.Lock] = {}


@contextmanager
def one_at_a_time(key: str) -> Iterator[None]:
    """Held while a step with cache key `key` looks for a cached result and, finding none, executes: a second step
    of this process with the same key (two runs of a switch matrix whose trainings are one) waits, then finds the
    first one's result in the cache instead of training again."""
    with _guard:
        lock = _executing.setdefault(key, threading.Lock())
    with lock:
        yield
