"""Migrations: up from an empty database, models == migrations (`alembic check`), refusals on a wrong schema."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, text

from alignflow.errors import StoreError, StoreSchemaError
from alignflow.store import Store
from alignflow.store import database as db
from alignflow.store.models import Base
from tests.store.sample import run_params


@pytest.fixture
def upgraded(db_url: str) -> Iterator[Engine]:
    """An engine on the test's database, migrated to the head."""
    engine = db.create_store_engine(db_url)
    try:
        db.upgrade(engine)
        yield engine
    finally:
        engine.dispose()


def test_upgrade_from_an_empty_database_creates_every_table(db_url: str) -> None:
    engine = db.create_store_engine(db_url)
    try:
        assert db.schema_state(engine).current is None
        state = db.upgrade(engine)
        assert state.current == state.head == db.head_revision()
        tables = set(inspect(engine).get_table_names())
        assert tables == set(Base.metadata.tables) | {"alembic_version"}
    finally:
        engine.dispose()


def test_the_head_every_command_checks_is_alembics_own() -> None:
    # the store checks a database is current against HEAD_REVISION without importing Alembic (issue 40)
    assert db.head_revision() == db.alembic_head_revision()


def test_a_database_with_two_heads_is_refused_by_name(upgraded: Engine) -> None:
    with upgraded.begin() as conn:
        conn.execute(text("INSERT INTO alembic_version (version_num) VALUES ('0004')"))
    with pytest.raises(StoreSchemaError, match="several schema heads"):
        db.schema_state(upgraded)


def test_models_match_the_migrations(upgraded: Engine) -> None:
    assert db.model_drift(upgraded) == []


def test_migrations_downgrade_to_empty_and_upgrade_again(upgraded: Engine) -> None:
    with upgraded.begin() as conn:
        command.downgrade(db.alembic_config(conn), "base")
    assert set(inspect(upgraded).get_table_names()) <= {"alembic_version"}
    assert db.upgrade(upgraded).up_to_date


def test_open_without_upgrade_on_an_empty_database_says_to_run_db_upgrade(db_url: str) -> None:
    message = r"empty schema, this alignflow needs revision \w+; run `alignflow db upgrade`"
    with pytest.raises(StoreSchemaError, match=message):
        Store.open(db_url, upgrade=False)


def test_open_with_upgrade_migrates_and_later_opens_need_nothing(db_url: str) -> None:
    Store.open(db_url).close()
    with Store.open(db_url, upgrade=False) as store:
        assert store.list_runs() == []


def test_a_schema_from_a_newer_alignflow_is_refused_even_with_upgrade(db_url: str, upgraded: Engine) -> None:
    with upgraded.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff_future'"))
    with pytest.raises(StoreSchemaError, match="ffff_future, which this alignflow does not know"):
        Store.open(db_url, upgrade=True)


def test_url_password_is_masked_in_messages() -> None:
    masked = db.mask_url("postgresql+psycopg://alice:s3cret@db.example:5432/alignflow")
    assert "s3cret" not in masked
    assert masked == "postgresql+psycopg://alice:***@db.example:5432/alignflow"


def test_bare_postgresql_url_means_psycopg3() -> None:
    assert db.parse_url("postgresql://u@h/d").drivername == "postgresql+psycopg"


def test_unsupported_backend_is_refused() -> None:
    with pytest.raises(StoreError, match="unsupported database 'mysql'"):
        db.create_store_engine("mysql://u:pw@h/d")


def test_unreachable_server_is_a_store_error_naming_the_masked_url() -> None:
    masked = r"postgresql\+psycopg://u:\*\*\*@127\.0\.0\.1:1/d: cannot read the schema"
    with pytest.raises(StoreError, match=masked) as info:
        Store.open("postgresql+psycopg://u:pw@127.0.0.1:1/d")
    assert "pw@" not in str(info.value)


def test_sqlite_store_uses_wal_and_a_busy_timeout(tmp_path: object) -> None:
    engine = db.create_store_engine(f"sqlite:///{tmp_path}/s.sqlite")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == int(db.BUSY_TIMEOUT_S * 1000)
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_a_store_with_runs_upgrades_and_keeps_them(db_url: str) -> None:
    # Migrations that rebuild `runs` (SQLite has no ALTER for a CHECK constraint) ran only on empty stores in tests;
    # on a store with step runs pointing at its runs, SQLite's DROP TABLE tripped the foreign keys (issue 40: the
    # demo's own store failed to open after an upgrade).
    engine = db.create_store_engine(db_url)
    try:
        with engine.begin() as conn:
            command.upgrade(db.alembic_config(conn), "0003")
            conn.execute(text("INSERT INTO experiments (id, name, created_at) VALUES (1, 'demo', '2026-01-01')"))
            conn.execute(text("INSERT INTO experiment_configs (id, experiment_id, sha256, config, created_at) "
                              "VALUES (1, 1, :sha, '{}', '2026-01-01')"), {"sha": "a" * 64})
            conn.execute(text("INSERT INTO runs (id, experiment_id, config_id, trigger, status, code_version, params, "
                              "started_at) VALUES ('0123456789ab', 1, 1, 'cli', 'failed', 'x', '{}', '2026-01-01')"))
            conn.execute(text("INSERT INTO step_runs (id, run_id, step, inputs, status, created_at) "
                              "VALUES ('ba9876543210', '0123456789ab', 'compare', '{}', 'failed', '2026-01-01')"))
        assert db.upgrade(engine).up_to_date
    finally:
        engine.dispose()
    with Store.open(db_url, upgrade=False) as store:
        (run,) = store.list_runs()
        assert (run.id, run.status) == ("0123456789ab", "failed")
        assert [s.id for s in store.steps(run.id)] == ["ba9876543210"]
        errored = store.create_run("demo", trigger="cli", code_version="x", params=run_params()).id
        store.finish_run(errored, status="error",
                         error="conversion.spec: unknown conversion spec 'twin-mo'")
        assert [r.status for r in store.list_runs()] == ["error", "failed"]
