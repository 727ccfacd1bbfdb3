"""The MindSpore twin runs each PyNative task on the thread that issues it (alignflow.frameworks.mindspore_host):
MindSpore's default waits for its task queue in a busy loop, which on a CPU host doubled the twin's CPU time beside
other work."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from alignflow.frameworks.mindspore_host import HOST_BLOCKING_RUN, run_host_tasks_inline
from alignflow.twin import mindspore_train


def test_the_setting_is_added_and_a_value_set_outside_is_kept() -> None:
    env: dict[str, str] = {}
    run_host_tasks_inline(env)
    assert env == {HOST_BLOCKING_RUN: "1"}
    env = {HOST_BLOCKING_RUN: "0"}
    run_host_tasks_inline(env)
    assert env == {HOST_BLOCKING_RUN: "0"}


def test_the_twin_trains_with_host_tasks_inline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Set before `train` runs its first MindSpore operation (MindSpore reads it once, at its first queued task)."""
    monkeypatch.delenv(HOST_BLOCKING_RUN, raising=False)
    seen: dict[str, str | None] = {}

    def train(*args: Any, **kwargs: Any) -> None:
        seen["value"] = os.environ.get(HOST_BLOCKING_RUN)

    monkeypatch.setattr(mindspore_train, "train", train)
    monkeypatch.setattr(mindspore_train, "_configure_logging", lambda: None)
    monkeypatch.setattr("alignflow.twin.mindformers_yaml.load_mindformers_config", lambda path: path)
    assert mindspore_train.main(["--config", str(tmp_path / "twin.yaml")]) == 0
    assert seen == {"value": "1"}


def test_the_mindformers_lab_runs_host_tasks_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab's launcher sets it before it imports MindSpore (its patches and MindSpore itself stand aside here)."""
    import types

    from alignflow.labs.mindformers_cpu import hyper_parallel_standin, kernels, launcher

    monkeypatch.delenv(HOST_BLOCKING_RUN, raising=False)
    seen: dict[str, str | None] = {}
    stand_in = types.ModuleType("mindspore")
    stand_in.runtime = types.SimpleNamespace(  # type: ignore[attr-defined]
        launch_blocking=lambda: seen.setdefault("value", os.environ.get(HOST_BLOCKING_RUN)))
    monkeypatch.setitem(sys.modules, "mindspore", stand_in)
    monkeypatch.setattr(launcher, "check_mindformers", lambda: None)
    monkeypatch.setattr(hyper_parallel_standin, "install", lambda: None)
    monkeypatch.setattr(kernels, "install", lambda: None)
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))  # prepare() prepends the interpreter's directory
    launcher.prepare()
    assert seen == {"value": "1"}
