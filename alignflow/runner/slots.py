"""At most `max_concurrent_jobs` jobs per host, across every run the controller executes.

One lock file per slot under the state dir; a job holds a slot (an `flock` on its file) from launch to the end of
polling. The lock dies with the process holding it, so a crashed controller never leaks a slot. This bounds what
one controller launches; two controllers sharing a host would need a shared lock (Prefect global concurrency
limits named `host-<name>` do that for a team server).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


@contextmanager
def host_slot(state_dir: Path, host: str, slots: int, *, poll_s: float = 1.0,
              on_wait: Callable[[str], None] | None = None) -> Iterator[int]:
    """Hold one of `slots` slots of `host`; waits (and says so once) while all are taken."""
    root = state_dir / "locks"
    root.mkdir(parents=True, exist_ok=True)
    announced = False
    while True:
        for i in range(slots):
            fd = os.open(root / f"{host}.{i}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield i
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        if not announced and on_wait is not None:
            on_wait(f"{host}: all {slots} job slot(s) busy (max_concurrent_jobs); waiting")
            announced = True
        time.sleep(poll_s)
