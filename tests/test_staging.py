"""`alignflow.staging`: a staged directory becomes its destination whole or not at all; what a dead writer left is
removed by the next write beside it, only when its owner is known dead; a held signal never undoes a commit.

Unit tier: no process is started. A dead owner is a marker naming a pid of another boot (what a reboot leaves) or
a pid no process has; signals are sent to this process itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
from pathlib import Path

import pytest

from alignflow import controller, staging
from alignflow.staging import MARKER, Interrupted, held_interruptions, staged_dir, sweep


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if staging.staging_destination(p.name) is not None)


def _plant(parent: Path, name: str, owner: dict[str, object] | None) -> Path:
    """A staging directory as a writer left it: its marker names `owner` (None: no marker)."""
    path = parent / f".{name}.abcd1234.partial"
    path.mkdir(parents=True)
    (path / "data.bin").write_bytes(b"half")
    if owner is not None:
        marker = {"owner": owner, "purpose": "convert megatron", "destination": str(parent / name), "created": 0.0}
        (path / MARKER).write_text(json.dumps(marker))
    return path


def _me() -> dict[str, object]:
    return controller.current().to_dict()


def _rebooted() -> dict[str, object]:
    return {**_me(), "boot_id": "00000000-0000-0000-0000-000000000000"}


def test_a_staged_directory_becomes_the_destination_without_its_marker(tmp_path: Path) -> None:
    dst = tmp_path / "out" / "ckpt"
    with staged_dir(dst, purpose="test") as tmp:
        assert tmp.parent == dst.parent
        assert staging.staging_destination(tmp.name) == "ckpt"
        marker = json.loads((tmp / MARKER).read_text())
        assert marker["owner"]["pid"] == os.getpid()
        assert marker["destination"] == str(dst.absolute())
        (tmp / "a.txt").write_text("whole")
    assert sorted(p.name for p in dst.iterdir()) == ["a.txt"]
    assert _leftovers(dst.parent) == []


def test_a_failed_block_leaves_neither_destination_nor_staging(tmp_path: Path) -> None:
    dst = tmp_path / "ckpt"
    def write() -> None:
        with staged_dir(dst, purpose="test") as tmp:
            (tmp / "a.txt").write_text("half")
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        write()
    assert list(tmp_path.iterdir()) == []


def test_an_existing_destination_is_refused_with_the_callers_error(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(LookupError, match="already exists"), staged_dir(
            tmp_path / "ckpt", purpose="test", refuse=LookupError):
        pass


def test_a_write_beside_removes_dead_writers_staging_of_any_destination(tmp_path: Path) -> None:
    rebooted = _plant(tmp_path, "other", _rebooted())
    gone_pid = _plant(tmp_path, "third", {**_me(), "pid": 2**22 + 7, "start_ticks": 1})
    with staged_dir(tmp_path / "ckpt", purpose="test"):
        pass
    assert not rebooted.exists()
    assert not gone_pid.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_reused_pid_is_no_owner(tmp_path: Path) -> None:
    """This very pid, but a start time of another process: the owner died and its pid went to someone else."""
    reused = _plant(tmp_path, "other", {**_me(), "start_ticks": int(_me()["start_ticks"] or 0) + 1})  # type: ignore[call-overload]
    assert sweep(tmp_path) == [reused]


def test_a_live_owner_and_an_owner_on_another_host_are_kept(tmp_path: Path) -> None:
    alive = _plant(tmp_path, "mine", _me())
    remote = _plant(tmp_path, "remote", {**_rebooted(), "host": "another-host"})
    assert sweep(tmp_path) == []
    assert staging.owner_state(alive, parent_locked=True)[0] == "alive"
    state, why = staging.owner_state(remote, parent_locked=True)
    assert (state, why.endswith("runs on another host")) == ("unknown", True)


def test_a_held_flock_keeps_even_a_dead_looking_marker(tmp_path: Path) -> None:
    held = _plant(tmp_path, "other", _rebooted())
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what its writer holds while it runs
        assert sweep(tmp_path) == []
    finally:
        os.close(fd)
    assert sweep(tmp_path) == [held]


def test_a_markerless_directory_is_removed_only_beside_its_own_destination(tmp_path: Path) -> None:
    """No marker: a writer killed between mkdir and its marker, or an older alignflow. Only `ckpt`'s own write
    removes `.ckpt.*.partial`; a write of another destination leaves it (it may not be alignflow's at all)."""
    bare = _plant(tmp_path, "ckpt", None)
    with staged_dir(tmp_path / "other", purpose="test"):
        pass
    assert bare.exists()
    with staged_dir(tmp_path / "ckpt", purpose="test"):
        pass
    assert not bare.exists()


def test_a_writer_killed_at_birth_leaves_an_empty_directory_any_write_beside_removes(tmp_path: Path) -> None:
    """Killed between mkdtemp and its marker (both happen under the parent's flock, so no live writer is seen
    so): nothing was written in it, and a write of another destination removes it."""
    born = tmp_path / ".ckpt.abcd1234.partial"
    born.mkdir()
    (tmp_path / ".torn.abcd1234.partial").mkdir()
    (tmp_path / ".torn.abcd1234.partial" / MARKER).write_text('{"owner": {"ho')  # killed while writing it
    with staged_dir(tmp_path / "other", purpose="test"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_a_held_sigint_is_taken_at_the_next_check_and_nothing_is_written(tmp_path: Path) -> None:
    dst = tmp_path / "ckpt"
    def write() -> None:
        with staged_dir(dst, purpose="test") as tmp:
            (tmp / "a.txt").write_text("half")
            os.kill(os.getpid(), signal.SIGINT)  # held: the write goes on
            (tmp / "b.txt").write_text("more")
            staging.check_interrupted()

    with held_interruptions() as held:
        with pytest.raises(Interrupted) as caught:
            write()
        assert held.completed == []
    assert caught.value.exit_code == 130
    assert list(tmp_path.iterdir()) == []


def test_a_signal_held_until_the_rename_is_taken_before_it(tmp_path: Path) -> None:
    dst = tmp_path / "ckpt"
    def write() -> None:
        with staged_dir(dst, purpose="test") as tmp:
            (tmp / "a.txt").write_text("whole")
            os.kill(os.getpid(), signal.SIGTERM)

    with held_interruptions(), pytest.raises(Interrupted) as caught:
        write()
    assert caught.value.exit_code == 143
    assert list(tmp_path.iterdir()) == []


def test_a_signal_during_the_rename_does_not_undo_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal lands while the directory is renamed into place (and a second one right after): the result is
    whole, recorded as completed, and nothing raises until the block is left."""
    dst = tmp_path / "ckpt"
    real_replace = os.replace

    def replace_then_signal(a: str, b: str) -> None:
        real_replace(a, b)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(staging.os, "replace", replace_then_signal)
    with held_interruptions() as held:
        with staged_dir(dst, purpose="test") as tmp:
            (tmp / "a.txt").write_text("whole")
        assert held.completed == [dst]
        assert held.received == [signal.SIGINT, signal.SIGINT]
    assert (dst / "a.txt").read_text() == "whole"


def test_a_second_signal_interrupts_at_once(tmp_path: Path) -> None:
    def two_signals() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10**6):  # the handler runs between bytecodes: it raises here
            pass
        pytest.fail("the second signal did not interrupt")

    with held_interruptions() as held, pytest.raises(Interrupted):
        two_signals()
    assert len(held.received) == 2


def test_the_previous_handlers_come_back(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with held_interruptions():
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
