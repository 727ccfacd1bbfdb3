"""Two `alignflow server start` at once end with one kept server, both reporting it (issue 49).

The server's start is replaced by a stand-in that takes its time and records a kept server of this process, as the
real one records its child: what is tested is the lock around the look for a running server and its start."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from alignflow import controller
from flows import server


def test_two_starts_at_once_start_one_server_and_both_report_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []

    def slow_start(state: Path, *, kept: bool, timeout_s: float | None = None) -> server.ServerRecord:
        started.append(1)
        record = server.ServerRecord(url="http://127.0.0.1:1/api", port=1, process=controller.current().to_dict(),
                                     kept=kept, log=str(tmp_path / "server.log"))
        server.kept_path(state).write_text(record.to_json())
        time.sleep(0.5)  # the health wait
        return record

    monkeypatch.setattr(server, "start", slow_start)
    said: list[str] = []
    results: list[tuple[server.ServerRecord, bool]] = []
    threads = [threading.Thread(target=lambda: results.append(server.start_kept(tmp_path, events=said.append)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(started) == 1
    assert sorted(now for _, now in results) == [False, True]
    assert results[0][0] == results[1][0]
    assert said == [f"waiting for the Prefect server of {tmp_path / 'prefect'} ({controller.current().describe()} "
                    "is creating it)"]


def test_runs_starting_their_servers_at_once_start_them_one_after_the_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each start migrates the servers' shared database: two at once on a fresh state dir killed the second server
    (`duplicate column name`)."""
    spans: list[tuple[float, float]] = []

    def slow_start(state: Path, *, kept: bool, timeout_s: float | None = None) -> server.ServerRecord:
        began = time.monotonic()
        time.sleep(0.3)  # the migrations, then the health wait
        spans.append((began, time.monotonic()))
        return server.ServerRecord(url=f"http://127.0.0.1:{len(spans)}/api", port=len(spans),
                                   process=controller.current().to_dict(), kept=kept, log="")

    monkeypatch.setattr(server, "start", slow_start)
    said: list[str] = []
    records: list[server.ServerRecord] = []
    threads = [threading.Thread(target=lambda: records.append(server.server_for_run(tmp_path, events=said.append)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (first, second) = sorted(spans)
    assert first[1] <= second[0]  # one after the other
    assert sorted(r.port for r in records) == [1, 2]
    assert not any(r.kept for r in records)
    assert said == [f"waiting for the Prefect server of {tmp_path / 'prefect'} ({controller.current().describe()} "
                    "is creating it)"]
