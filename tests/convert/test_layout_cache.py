"""The layout cache's missing entry is planned once while the other callers wait, then read by all (issue 49)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from alignflow.convert import sharding
from alignflow.convert.registry import load_spec


def test_callers_missing_one_entry_at_once_plan_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sharding.CACHE_ENV, str(tmp_path / "cache"))
    planned: list[str] = []

    def slow_plan(request: str) -> dict[str, Any]:  # megatron-core in a child process: seconds
        planned.append(request)
        time.sleep(0.3)
        return {"megatron_core": "0.16.1", "ranks": []}

    monkeypatch.setattr(sharding, "_planned", slow_plan)
    model = load_spec("twin-dense").model
    found: list[sharding.Layouts] = []
    threads = [threading.Thread(target=lambda: found.append(sharding.plan_layouts(model))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(planned) == 1
    assert [f.megatron_core for f in found] == ["0.16.1"] * 3
    assert sorted(p.suffix for p in (tmp_path / "cache" / "mcore-layouts").iterdir()) == [".json", ".lock"]
