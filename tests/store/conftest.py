"""Every store test runs twice: on SQLite and on the session's real PostgreSQL server (a fresh database each)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from alignflow.store import Store


class TickingClock:
    """A clock that advances one second per reading, so that order by time is deterministic in tests."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


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


CONFIG = {"name": "demo", "model": {"hidden_size": 64}}
CONFIG_SHA = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64
