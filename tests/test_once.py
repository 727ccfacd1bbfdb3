"""`alignflow.once`: what is made on first use and shared is made by one caller while the others wait, say whom they
wait for, and verify what they find; a creator killed with SIGKILL leaves nothing that stops the next one (issue 49).

Threads stand in for runs where a lock is all that is tested (a flock of separately opened files excludes threads
of one process as it does processes); the killed creator is a real process, killed with SIGKILL.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from alignflow import once, staging
from alignflow.errors import RunCancelled


def _build_slowly(tmp: Path, *, started: threading.Event | None = None, text: str = "whole") -> None:
    if started is not None:
        started.set()
    time.sleep(0.3)
    (tmp / "data.bin").write_text(text)


def test_racing_callers_create_once_and_every_one_verifies_the_result(tmp_path: Path) -> None:
    dst = tmp_path / "data" / "demo"
    built: list[int] = []
    verified: list[str] = []
    messages: list[str] = []
    results: dict[int, once.Made[str]] = {}

    def build(tmp: Path) -> None:
        built.append(1)
        _build_slowly(tmp)

    def verify(path: Path) -> str:
        verified.append(path.name)
        return (path / "data.bin").read_text()

    def caller(i: int) -> None:
        results[i] = once.create_once(dst, what="the data demo", build=build, verify=verify, run_id=f"run{i}",
                                      events=messages.append)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    assert [r.created for r in results.values()].count(True) == 1
    assert {r.value for r in results.values()} == {"whole"}
    assert len(verified) == 4  # the creator verifies what it made, as the others do
    creator = next(f"run{i}" for i, r in results.items() if r.created)
    waits = [m for m in messages if m.startswith("waiting for")]
    assert waits
    assert all(m == f"waiting for the data demo (run {creator} is creating it)" for m in waits)
    assert all(r.waited_for is None or r.waited_for.run_id == creator for r in results.values())
    assert sorted(p.name for p in dst.parent.iterdir()) == [".demo.lock", "demo"]


def test_a_failed_creation_leaves_nothing_and_the_next_caller_creates_it(tmp_path: Path) -> None:
    dst = tmp_path / "base"

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        once.create_once(dst, what="the base", build=broken, verify=lambda p: None)
    assert not dst.exists()
    made = once.create_once(dst, what="the base", build=_build_slowly, verify=lambda p: (p / "data.bin").read_text())
    assert made.created
    assert made.value == "whole"


def test_an_existing_destination_is_verified_not_rebuilt(tmp_path: Path) -> None:
    dst = tmp_path / "demo"
    dst.mkdir()
    (dst / "data.bin").write_text("earlier")
    made = once.create_once(dst, what="the data", build=lambda tmp: (_ for _ in ()).throw(AssertionError),
                            verify=lambda p: (p / "data.bin").read_text())
    assert (made.created, made.value, made.waited_for) == (False, "earlier", None)


_CREATOR = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from alignflow import once

    def build(tmp):
        (tmp / "half.bin").write_text("half")
        print("building", flush=True)
        time.sleep(600)

    once.create_once(Path(sys.argv[1]), what="the data demo", build=build, verify=lambda p: None, run_id="killed")
""")


@pytest.mark.integration  # the creator is a real process, killed with SIGKILL
def test_a_creator_killed_mid_creation_releases_the_lock_and_the_next_caller_creates_it(tmp_path: Path) -> None:
    dst = tmp_path / "data" / "demo"
    with subprocess.Popen([sys.executable, "-c", _CREATOR, str(dst)], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "building\n"
            messages: list[str] = []
            waiter = threading.Thread(target=lambda: messages.append(repr(once.create_once(
                dst, what="the data demo", build=lambda tmp: (tmp / "data.bin").write_text("whole"),
                verify=lambda p: sorted(x.name for x in p.iterdir()), run_id="next", events=messages.append))))
            waiter.start()
            deadline = time.monotonic() + 30
            while not messages and time.monotonic() < deadline:
                time.sleep(0.05)
            assert messages[:1] == ["waiting for the data demo (run killed is creating it)"]
            proc.kill()  # SIGKILL: the kernel drops its flock; its staging directory stays behind
            waiter.join(30)
            assert not waiter.is_alive()
        finally:
            proc.kill()  # a failed assertion must not wait out the creator's sleep
    assert "created=True" in messages[-1]
    assert "value=['data.bin']" in messages[-1]
    assert any(m == f"created the data demo: {dst}" for m in messages)
    assert [p.name for p in dst.parent.iterdir() if staging.staging_destination(p.name)] == []  # swept


def test_unless_held_holds_a_free_lock_and_names_the_holder_of_a_taken_one(tmp_path: Path) -> None:
    lock = tmp_path / "serve.lock"
    with once.unless_held(lock, what="alignflow serve", run_id="first") as other:
        assert other is None
        with once.unless_held(lock, what="alignflow serve") as second:
            assert second == "run first"  # not waited for: the second one reports the first and ends
    with once.unless_held(lock, what="alignflow serve") as after:
        assert after is None  # released with the block


def test_a_wait_ends_when_its_check_raises_and_the_lock_is_left_to_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "step.lock"
    polls: list[int] = []

    def cancelled() -> None:
        polls.append(1)
        if len(polls) == 3:
            raise RunCancelled("run r was cancelled while npu_base_train waited for npu_base_train")

    with once.exclusive(lock, what="npu_base_train", run_id="holder"), pytest.raises(RunCancelled), \
            once.exclusive(lock, what="npu_base_train", check=cancelled):
        raise AssertionError("never held")
    assert len(polls) == 3
