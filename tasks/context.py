"""How a task reaches the core: the store, the run's context, the state dir and transports.

Resolved from the environment at call time, and kept once per process: every task of a run (and the CLI that
started it, in the same process) shares one `Store` and one `RunContext` per run, instead of opening the database
and re-reading the run's record for each task. A Prefect worker that runs tasks in another process opens its own.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alignflow.runner.engine import PROGRESS_EVERY_S, StepRunner, TransportFactory, Verified
from alignflow.runner.progress import ProgressFn
from alignflow.runner.session import Events, RunContext, default_state_dir, open_run
from alignflow.state import database_url
from alignflow.store import Store
from alignflow.transport import open_transport

_lock = threading.Lock()
_stores: dict[str, Store] = {}
_contexts: dict[tuple[str, str], RunContext] = {}


def state_dir() -> Path:
    return default_state_dir()


def open_store() -> Store:
    """The process's store for the current state dir / database URL (opened, and migrated, on first use)."""
    url = database_url(state_dir())
    with _lock:
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = Store.open(state_dir=state_dir(), upgrade=True)
        return store


def run_context(run_id: str) -> RunContext:
    """The recorded run's context, read once per process (a run's record does not change while it runs)."""
    store = open_store()
    key = (store.url, run_id)
    with _lock:
        ctx = _contexts.get(key)
    if ctx is None:
        ctx = open_run(store, run_id)
        with _lock:
            _contexts[key] = ctx
    return ctx


def step_label(run_id: str, step: str) -> str:
    """`step` as the terminal's rows and the UI's task runs name it: prefixed with the variant for a training of a
    switch matrix (`06_capacity/gpu_train`), whose trainings run side by side with the same step names."""
    ctx = run_context(run_id)
    if ctx.options.trigger != "matrix" or "/" not in ctx.experiment.name:
        return step
    return f"{ctx.experiment.name.split('/', 1)[1]}/{step}"


def transport_factory() -> TransportFactory:
    return open_transport


@contextmanager
def runner_for(run_id: str, *, events: Events | None = None, warnings: Events | None = None,
               progress: ProgressFn | None = None, progress_every_s: float = PROGRESS_EVERY_S,
               verified: Iterable[Verified] = ()) -> Iterator[StepRunner]:
    """A `StepRunner` of the run for one task (its transports are the task's own: runners are not shared)."""
    runner = StepRunner(run_context(run_id), store=open_store(), state_dir=state_dir(),
                        transport_factory=transport_factory(), events=events, warnings=warnings, progress=progress,
                        progress_every_s=progress_every_s, verified=verified)
    try:
        yield runner
    finally:
        runner.close()


def close_stores() -> None:
    """Close every store this process opened (at exit; tests call it between state dirs)."""
    with _lock:
        stores = list(_stores.values())
        _stores.clear()
        _contexts.clear()
    for store in stores:
        store.close()


atexit.register(close_stores)
