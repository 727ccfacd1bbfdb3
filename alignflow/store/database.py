"""Engines and migrations: the only place that knows SQLite from PostgreSQL.

SQLite (the default, one controller): WAL so that readers never block the writer, a busy timeout so that
concurrent writers wait instead of failing, foreign keys on, and write transactions that start with
`BEGIN IMMEDIATE`. The last one matters: Python's sqlite3 starts transactions deferred, and a deferred
transaction that read before writing gets `SQLITE_BUSY` *without* waiting when another process committed in
between (the busy handler cannot help a stale snapshot) — two flows writing at once would lose a write.
Read-only sessions stay deferred so that `alignflow history` never queues behind a writer. A database whose file
or directory cannot be written (an archived state dir, a read-only mount) opens as SQLite's `immutable` read-only
URI: nobody can write it through this path, WAL's shared memory cannot be made there, and reading commands
work; a write is a `StoreReadOnly` (exit 2) naming the file.

PostgreSQL (production, through `ALIGNFLOW_DB_URL`): psycopg 3 (`postgresql+psycopg://`; a bare
`postgresql://` is read as psycopg 3 too), pre-ping so that a server restart costs one reconnect, and an
advisory lock around migrations so that two processes upgrading an empty database do not race.

The migrations ship inside the package (`migrations/`), so `alignflow db upgrade` works from an installed
wheel; `alembic_config()` points Alembic at them without any `alembic.ini`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from alignflow.errors import StoreError, StoreReadOnly, StoreSchemaError

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
BUSY_TIMEOUT_S = 60.0
READ_ONLY_OPTION = "alignflow_read_only"
# Any constant works; it only has to be the same in every alignflow process (pg_advisory_xact_lock takes a bigint).
_MIGRATION_LOCK_KEY = 0x616C69676E666C6F  # "alignflo"
# The newest migration's revision. Every command opens the store and checks it is at head; importing Alembic and
# reading its script directory for that cost a fully cached `alignflow run` ~0.2 s of its ~5 (issue 40), so Alembic
# is imported only to migrate. tests/store/test_migrations.py checks this is Alembic's own head.
HEAD_REVISION = "0005"
_VERSION_TABLE = "alembic_version"  # Alembic's default, which migrations/env.py keeps


def parse_url(url: str) -> URL:
    """Parse a database URL; read `postgresql://` as psycopg 3; refuse backends the store does not support."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"database URL {url!r} is not a URL: {exc}; expected sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST/DB") from None
    backend = parsed.get_backend_name()
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(f"{mask_url(url)}: unsupported database {backend!r}; use sqlite or postgresql+psycopg")
    return parsed


def mask_url(url: str | URL) -> str:
    """The URL with any password replaced by `***` (for messages and `alignflow db upgrade`)."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except ArgumentError:
        return "<unparseable database URL>"
    return parsed.render_as_string(hide_password=True)


def missing_sqlite_file(url: str) -> Path | None:
    """The SQLite file `url` names if it does not exist yet (None for PostgreSQL or an existing file)."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database).expanduser()
    return None if path.exists() else path


def create_store_engine(url: str) -> Engine:
    """An engine for the store at `url`, set up for safe concurrent use (see the module docstring)."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    return create_engine(parsed, pool_pre_ping=True)


def _sqlite_engine(parsed: URL) -> Engine:
    database = parsed.database or ""
    kwargs: dict[str, Any] = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
    immutable = False
    if database in ("", ":memory:"):
        kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
    else:
        path = Path(database).expanduser()
        immutable = read_only_file(path)
        if immutable:
            uri = f"{path.resolve().as_uri()}?immutable=1"
            kwargs["creator"] = lambda: sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"{mask_url(parsed)}: cannot create the state directory: {exc}") from exc
    engine = create_engine(parsed, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            if database not in ("", ":memory:") and not immutable:
                _enter_wal(cursor)
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        read_only = conn.get_execution_options().get(READ_ONLY_OPTION, False)
        conn.exec_driver_sql("BEGIN DEFERRED" if read_only else "BEGIN IMMEDIATE")

    return engine


def read_only_file(path: Path) -> bool:
    """True when the database file exists but it or its directory cannot be written (SQLite needs the directory
    for its journal and WAL files). `os.access` answers for root too on a read-only mount (EROFS)."""
    try:
        return path.is_file() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))
    except OSError:  # a directory on the way cannot be entered: opening it says so (StoreError, no traceback)
        return False


def _enter_wal(cursor: Any) -> None:
    """Switch the database to WAL, waiting (up to the busy timeout) while another process holds it.

    Two processes opening a new database at once both ask for WAL; the loser's `PRAGMA journal_mode=WAL` fails
    with "database is locked" at once - SQLite does not call the busy handler for it - so this retries. A database
    already in WAL (every open after the first) answers without locking anything.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


# --- migrations ---------------------------------------------------------------------------------------------------


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic configuration pointing at the packaged migrations; `connection` is used by `env.py` if given."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The revision this alignflow's models correspond to."""
    return HEAD_REVISION


def alembic_head_revision() -> str:
    """The head of the packaged migrations as Alembic reads them (what `HEAD_REVISION` must be)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the packaged migrations have no head revision"
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at (None: no alignflow schema yet): the row of Alembic's version table, read as
    Alembic's `MigrationContext.get_current_revision` reads it (one row; a branched history would have several)."""
    if not inspect(connection).has_table(_VERSION_TABLE):
        return None
    rows = [row[0] for row in connection.execute(text(f"SELECT version_num FROM {_VERSION_TABLE}"))]
    if len(rows) > 1:
        raise StoreSchemaError(f"{mask_url(connection.engine.url)}: the database has several schema heads "
                               f"({', '.join(sorted(rows))}); alignflow's migrations are linear")
    return rows[0] if rows else None


@dataclass(frozen=True, slots=True)
class SchemaState:
    """Where a database stands relative to this alignflow's migrations."""

    url: str  # password masked
    current: str | None
    head: str

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def known(self) -> bool:
        """False when the database was migrated by a newer alignflow (a revision we do not have)."""
        if self.current is None:
            return True
        from alembic.script import ScriptDirectory
        from alembic.util.exc import CommandError

        try:
            return ScriptDirectory.from_config(alembic_config()).get_revision(self.current) is not None
        except CommandError:
            return False


def schema_state(engine: Engine) -> SchemaState:
    with translate_errors(engine, "cannot read the schema revision"), engine.connect() as conn:
        current = current_revision(conn)
    return SchemaState(url=mask_url(engine.url), current=current, head=head_revision())


def upgrade(engine: Engine) -> SchemaState:
    """Apply every pending migration in one transaction (serialized across processes); return the new state.

    On SQLite a migration that changes a table rebuilds it (batch mode: copy, drop, rename), and dropping `runs`
    while step runs point at it trips the foreign keys. SQLite's own procedure for such changes
    (https://www.sqlite.org/lang_altertable.html#otheralter) is followed: enforcement off for the migration
    (it can only change outside a transaction), `PRAGMA foreign_key_check` before the commit — a migration that
    left a dangling reference is rolled back — and on again after."""
    with translate_errors(engine, "migration failed"), engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            _sqlite_foreign_keys(conn, on=False)
        try:
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
                from alembic import command

                before = current_revision(conn)
                command.upgrade(alembic_config(conn), "head")
                after = current_revision(conn)
                dangling = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() if sqlite else []
                if dangling:
                    raise StoreError(f"{mask_url(engine.url)}: migration to {after} left rows whose references "
                                     f"are gone ({dangling[:3]}); nothing was changed")
        finally:
            if sqlite:
                _sqlite_foreign_keys(conn, on=True)
    if before != after:
        log.info("%s: schema upgraded from %s to %s", mask_url(engine.url), before or "empty", after)
    return SchemaState(url=mask_url(engine.url), current=after, head=head_revision())


def _sqlite_foreign_keys(conn: Connection, *, on: bool) -> None:
    """Switch SQLite's foreign key enforcement on the DBAPI connection itself: the pragma is a no-op inside a
    transaction, and every statement through SQLAlchemy would begin one (`_on_begin`)."""
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    dbapi.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def require_current(engine: Engine, *, upgrade_if_behind: bool) -> SchemaState:
    """Make sure the schema is at head: upgrade it, or fail with what to run."""
    state = schema_state(engine)
    if state.up_to_date:
        return state
    if not state.known:
        raise StoreSchemaError(
            f"{state.url}: the database is at schema revision {state.current}, which this alignflow does not know "
            f"(its newest is {state.head}); it was migrated by a newer alignflow - upgrade alignflow"
        )
    if upgrade_if_behind:
        return upgrade(engine)
    where = f"revision {state.current}" if state.current else "an empty schema"
    raise StoreSchemaError(
        f"{state.url}: the database is at {where}, this alignflow needs revision {state.head}; "
        "run `alignflow db upgrade`"
    )


def model_drift(engine: Engine) -> list[object]:
    """Differences between the models and the migrated database (empty when the migrations match the models), as
    Alembic's autogenerate lists them (tuples that print what differs)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from alignflow.store.models import Base

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return list(compare_metadata(ctx, Base.metadata))


def new_revision(message: str) -> Path:
    """Generate a migration from the difference between the models and the current head (for developers).

    Autogenerate compares against a scratch SQLite database upgraded to head, so it needs no server; SQLite
    makes Alembic render batch operations, which PostgreSQL runs as plain ALTERs - one file for both backends.
    """
    import tempfile

    from alembic import command

    with tempfile.TemporaryDirectory(prefix="alignflow-revision-") as scratch:
        engine = create_store_engine(f"sqlite:///{Path(scratch) / 'scratch.sqlite'}")
        try:
            upgrade(engine)
            with engine.begin() as conn:
                head = alembic_head_revision()
                # Sequential ids (0001, 0002, ...) keep the versions folder in migration order.
                rev_id = f"{int(head) + 1:04d}" if head.isdigit() else None
                script = command.revision(alembic_config(conn), message=message, autogenerate=True, rev_id=rev_id)
        finally:
            engine.dispose()
    scripts = script if isinstance(script, list) else [script]
    assert scripts[0] is not None, "alembic generated no migration"
    # HEAD_REVISION must follow: tests/store/test_migrations.py says so until it does
    return Path(scripts[0].path)


@contextmanager
def translate_errors(engine: Engine, what: str) -> Iterator[None]:
    """Turn SQLAlchemy's exceptions into a `StoreError` that names the database (password masked)."""
    try:
        yield
    except StoreError:
        raise
    except SQLAlchemyError as exc:
        raise store_error(mask_url(engine.url), what, exc) from exc


def store_error(url: str, what: str, exc: SQLAlchemyError) -> StoreError:
    """The `StoreError` for a failed database call: `StoreReadOnly` (exit 2) for a write to a read-only store."""
    message = first_line(exc)
    if "readonly database" in message:
        return StoreReadOnly(f"{url}: {what}: the store is read-only ({message}); reading commands work on it, "
                             "a run needs a writable state directory (ALIGNFLOW_STATE_DIR) or another "
                             "ALIGNFLOW_DB_URL")
    return StoreError(f"{url}: {what}: {message}")


def first_line(exc: SQLAlchemyError) -> str:
    """The database's own message (its first line), or the exception's type when it has none."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
