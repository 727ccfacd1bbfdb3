"""Alembic environment of the alignflow store.

alignflow runs migrations programmatically (`alignflow.store.database.upgrade`), handing over a connection that
already holds the migration lock and its transaction. Run from the `alembic` command line instead
(`alembic -c alignflow/store/migrations/alembic.ini ...`), it connects to the store that `ALIGNFLOW_DB_URL` /
`ALIGNFLOW_STATE_DIR` name, or to `-x url=...`.
"""

from alembic import context
from sqlalchemy import Connection

from alignflow.state import database_url
from alignflow.store.database import create_store_engine
from alignflow.store.models import Base


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=Base.metadata,
        compare_type=True,
        compare_server_default=True,
        **kwargs,  # type: ignore[arg-type]
    )


def _run(connection: Connection) -> None:
    # SQLite cannot ALTER most things in place; batch mode rebuilds the table, so later migrations stay portable.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    return context.get_x_argument(as_dictionary=True).get("url") or database_url()


if context.is_offline_mode():
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()
else:
    given = context.config.attributes.get("connection")
    if given is not None:
        _run(given)
    else:
        engine = create_store_engine(_url())
        with engine.begin() as conn:
            _run(conn)
        engine.dispose()
