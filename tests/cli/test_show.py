"""`alignflow show RUN` and the summary `alignflow run` ends with: each duration says what it measured."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from alignflow.cli.show import print_view
from alignflow.runview import RunView


def test_the_runs_and_the_commands_durations_are_labelled(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 47: a cached run printed "took 5.1 s" and `time: 8.4 s`, unlabelled
    monkeypatch.setenv("COLUMNS", "120")
    view = RunView(run_id="0123456789ab", experiment="demo", status="completed", verdict="pass", trigger="cli",
                   parent_id=None, code_version="alignflow 0.1.0", started=datetime(2026, 1, 1, tzinfo=UTC),
                   finished=None, duration_s=5.1, error=None, report=None, steps=(), criteria=(), snapshots={})
    print_view(view, seconds=8.4)
    out = capsys.readouterr().out
    assert "· run time 5.1 s ·" in out
    assert "command time: 8.4 s (the run, plus the checks and Prefect before it)" in out
    assert "took" not in out
    assert "time:    " not in out
