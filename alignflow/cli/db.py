"""`alignflow db upgrade | current | check`: the store's schema (Alembic migrations shipped in the package)."""

from __future__ import annotations

import typer

URL_HELP = "Database URL; default $ALIGNFLOW_DB_URL, else SQLite in $ALIGNFLOW_STATE_DIR (default ./.alignflow)."


def upgrade_cmd(url: str | None = typer.Option(None, "--url", help=URL_HELP)) -> None:
    """Apply every pending migration (creates the SQLite file and its directory if needed).

    Exit 0 at head, 1 when a migration fails.
    """
    from alignflow.store import database

    engine = database.create_store_engine(_url(url))
    try:
        before = database.schema_state(engine)
        after = database.require_current(engine, upgrade_if_behind=True)
    finally:
        engine.dispose()
    typer.echo(f"database: {after.url}")
    if before.current != after.current:
        typer.echo(f"upgraded: {before.current or 'empty'} -> {after.current}")
    typer.echo(f"revision: {after.current} (head)")

def current_cmd(url: str | None = typer.Option(None, "--url", help=URL_HELP)) -> None:
    """Show the database's schema revision and whether it is this alignflow's head.

    Exit 0, 1 when the database cannot be read.
    """
    from alignflow.store import database

    engine = database.create_store_engine(_url(url))
    try:
        st = database.schema_state(engine)
    finally:
        engine.dispose()
    typer.echo(f"database: {st.url}")
    if st.up_to_date:
        typer.echo(f"revision: {st.current} (head)")
    elif not st.known:
        typer.echo(f"revision: {st.current} (unknown to this alignflow, whose head is {st.head}: "
                   "made by a newer alignflow)")
    else:
        typer.echo(f"revision: {st.current or 'none (empty)'} (behind head {st.head}; "
                   "run `alignflow db upgrade`)")

def check_cmd(url: str | None = typer.Option(None, "--url", help=URL_HELP)) -> None:
    """Exit 1 unless the database is at head and its tables match the models (like `alembic check`)."""
    from alignflow.store import database

    engine = database.create_store_engine(_url(url))
    try:
        st = database.schema_state(engine)
        if not st.up_to_date:
            typer.echo(f"{st.url}: at revision {st.current or 'none'}, head is {st.head}; "
                       "run `alignflow db upgrade`", err=True)
            raise typer.Exit(1)
        drift = database.model_drift(engine)
    finally:
        engine.dispose()
    if drift:
        typer.echo(f"{st.url}: the models differ from the migrated schema "
                   "(a model change needs a migration: `alignflow db revision -m ...`):", err=True)
        for diff in drift:
            typer.echo(f"  {diff}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{st.url}: revision {st.head} (head); models match the migrations")

def revision_cmd(message: str = typer.Option(..., "-m", "--message", help="What the migration does.")) -> None:
    """For developers: generate a migration from the model changes (against a scratch SQLite at head).

    Exit 0 written, 1 when it cannot be generated.
    """
    from alignflow.store import database

    path = database.new_revision(message)
    typer.echo(f"wrote {path}; set HEAD_REVISION in alignflow/store/database.py to its revision and review it (both "
               "backends: `pytest tests/store`) before committing")


def register(app: typer.Typer) -> None:
    db = typer.Typer(help="The store's database: apply and inspect schema migrations.", no_args_is_help=True)
    app.add_typer(db, name="db")
    db.command("upgrade")(upgrade_cmd)
    db.command("current")(current_cmd)
    db.command("check")(check_cmd)
    db.command("revision", hidden=True)(revision_cmd)


def _url(url: str | None) -> str:
    from alignflow.state import database_url

    return url or database_url()
