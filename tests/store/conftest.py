"""Every store test runs twice: on SQLite and on the session's real PostgreSQL server (a fresh database each)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from alignflow.store import Store
from tests.store.sample import TickingClock


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'store.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def clock() -> TickingClock:
    return TickingClock()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store migrated to head once per session (the migrations: 0.2 s a store, most of these tests' time;
    tests/store/test_migrations.py migrates real ones from every revision)."""
    path = tmp_path_factory.mktemp("migrated") / "store.sqlite"
    Store.open(f"sqlite:///{path}").close()
    return path


@pytest.fixture
def store(db_url: str, clock: TickingClock, migrated_sqlite: Path) -> Iterator[Store]:
    if db_url.startswith("sqlite:///"):  # a copy of the migrated store, opened as any other: its schema checked
        target = Path(db_url.removeprefix("sqlite:///"))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_sqlite, target)
    with Store.open(db_url, clock=clock) as s:
        yield s
