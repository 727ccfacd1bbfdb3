"""The store as the run commands open it: reconciled first, so no run whose controller died is shown `running`.

Every command that reads or writes runs (`run`, `rerun`, `reproduce`, `show`, `history`, `cancel`) opens the store
through `open_store()`: running runs whose controller is provably dead are marked `interrupted` on the way in
(`alignflow.store.interruptions`), and a note on stderr says which, with their jobs and what to do. The staging
leftovers such a controller left in its run's own directory (a copy it was making when it died) are removed then.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from alignflow.store import Store
    from alignflow.store.interruptions import Reconciliation


def open_store(state: Path | None = None, *, quiet: bool = False, reconciled: bool = True,
               existing: bool = False) -> Store:
    """The store (migrated), reconciled unless `reconciled=False`; notes about newly interrupted runs go to stderr
    unless `quiet`. With `existing`, a SQLite store that is not there yet is a usage error (a command that looks a
    run up does not create a store as a side effect)."""
    from alignflow.errors import RecordNotFound
    from alignflow.state import database_url, state_dir
    from alignflow.store import Store, database

    url = database_url(state or state_dir())
    missing = database.missing_sqlite_file(url) if existing else None
    if missing is not None:
        raise RecordNotFound(f"no store at {missing}: nothing has been recorded yet (ALIGNFLOW_STATE_DIR?)")
    store = Store.open(url, upgrade=True)
    if not reconciled:
        return store
    try:
        result = reconcile_store(store, state or state_dir())
    except BaseException:
        store.close()
        raise
    if not quiet:
        report(result, verbose=False)
    return store


def reconcile_store(store: Store, state: Path) -> Reconciliation:
    """Reconcile the store (`alignflow.store.interruptions.reconcile`), then remove the staging that the newly
    interrupted runs' controllers left in their run directories under `state` (`alignflow.gc.remove_run_staging`)."""
    from alignflow.store.interruptions import reconcile

    result = reconcile(store)
    if result.interrupted:
        from alignflow.gc import remove_run_staging

        for item in result.interrupted:
            remove_run_staging(state, item.run.id)
    return result


def report(result: Reconciliation, *, verbose: bool) -> None:
    """Say what reconciliation did (and, when `verbose`, which running runs it could not judge)."""
    for item in result.interrupted:
        run = item.run
        typer.echo(f"run {run.id} of {run.experiment} interrupted: {item.reason}", err=True)
        for job in item.jobs:
            typer.echo(f"  job possibly still running: {job.describe()}", err=True)
        typer.echo(f"  `alignflow rerun {run.id}` continues it (finished steps are reused); "
                   f"`alignflow cancel {run.id}` kills its jobs", err=True)
    if verbose:
        for unverifiable in result.unverifiable:
            typer.echo(f"run {unverifiable.run.id} is running: {unverifiable.reason}", err=True)
