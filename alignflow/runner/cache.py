"""Cache keys of pipeline steps (docs/architecture.md#records-caching-and-re-runs).

A step's cache key is the sha256 of: the step name, its command and config *templates* (output and input
locations are placeholders, so where a file happens to live does not change the key), the code version of what
runs it, and the sha256 of each declared input. Never an output's hash: that would change the key as soon as the
output exists (docs/orchestration.md#g1-hash-declared-inputs-only).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from alignflow.once import exclusive


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


@contextmanager
def one_at_a_time(key: str, *, lock_dir: Path, what: str, run_id: str | None = None,
                  events: Callable[[str], None] | None = None, check: Callable[[], None] | None = None
                  ) -> Iterator[None]:
    """Held while a step with cache key `key` looks for a cached result and, finding none, executes: a second step
    with the same key - two runs of a switch matrix whose trainings are one, in this process; two runs of one
    experiment, or two matrices sharing a training, in others (issue 49) - waits, saying `waiting for <what> (run
    <id> is creating it)`, then finds the first one's result in the cache instead of training again.

    A flock of `<lock_dir>/<key>.lock` (`alignflow.once.exclusive`): the kernel drops it when its holder dies, and
    the waiter then runs the step itself. `check` may end a wait (it raises when the waiting run is cancelled)."""
    with exclusive(lock_dir / f"{key[:32]}.lock", what=what, run_id=run_id, events=events, check=check):
        yield
