"""Shared test values for the store suite: a deterministic clock and sample digests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class TickingClock:
    """A clock that advances one second per reading, so that order by time is deterministic in tests."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


CONFIG = {"name": "demo", "model": {"hidden_size": 64}}
CONFIG_SHA = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64
