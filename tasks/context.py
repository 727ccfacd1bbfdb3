"""How a task reaches the core: the store, the state dir, transports — resolved from the environment at call time.

Tasks re-open everything by run id, so each is self-contained across retries and processes (a Prefect worker
may run them in a subprocess; a retry must not depend on objects of the failed attempt).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alignflow.runner.engine import StepRunner
from alignflow.runner.run import open_runner
from alignflow.runner.session import default_state_dir


def state_dir() -> Path:
    return default_state_dir()


def open_store() -> Any:
    from alignflow.store import Store

    return Store.open(state_dir=state_dir(), upgrade=True)


def transport_factory() -> Any:
    from alignflow.transport import open_transport

    return open_transport


@contextmanager
def runner_for(run_id: str, *, events: Any = None) -> Iterator[StepRunner]:
    store = open_store()
    runner = open_runner(run_id, store=store, state_dir=state_dir(), transport_factory=transport_factory(),
                         events=events)
    try:
        yield runner
    finally:
        runner.close()
        store.close()


def retry_on_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry only transport errors (connection, timeout); never a failed command, sentinel or comparison."""
    try:
        state.result()
    except Exception as exc:  # the state's exception is re-raised here
        return bool(getattr(exc, "retryable", False))
    return False
