"""Every store test runs twice: on SQLite and on the session's real PostgreSQL server (a fresh database each)."""

from __future__ import annotations

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


@pytest.fixture
def store(db_url: str, clock: TickingClock) -> Iterator[Store]:
    with Store.open(db_url, clock=clock) as s:
        yield s
