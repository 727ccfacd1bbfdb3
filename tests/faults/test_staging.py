"""Issue 16, items 6 and 7: concurrent controllers on one destination, and staging that dies half-way.

- Two identical copies at once used to end with one `PathExists` ("appeared while the copy was running"): the
  copy now holds the destination's host lock, and the second caller adopts the first's verified copy.
- A copy or a conversion killed with SIGKILL left `.af-partial-*` / `.<name>.*.partial` behind forever; the next
  operation on the same destination removes them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from alignflow.fingerprint import Fingerprint, fingerprint
from alignflow.transport import copy_between
from tests.faults.conftest import Site, staging_leftovers

pytestmark = pytest.mark.integration

PAYLOAD_FILES = 8
PAYLOAD_BYTES = 4 << 20  # per file: large enough that two copies overlap in time


def _payload(site: Site, name: str = "data") -> str:
    for i in range(PAYLOAD_FILES):
        site.write(f"{name}/part-{i}.bin", os.urandom(PAYLOAD_BYTES))
    return f"{site.area}/{name}"


def test_two_identical_copies_at_once_both_succeed_with_one_verified_copy(site: Site) -> None:
    src = _payload(site)
    want = site.t.sha256([src])[src]
    controllers = [site.another(), site.another()]  # two controllers, each with its own connection
    results: list[Fingerprint | BaseException] = []
    start = threading.Barrier(2)

    def copy(t: object) -> None:
        start.wait()
        try:
            results.append(copy_between(t, src, t, f"{site.area}/inputs/data-x"))  # type: ignore[arg-type]
        except BaseException as exc:  # the test reports it
            results.append(exc)

    threads = [threading.Thread(target=copy, args=(t,)) for t in controllers]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert [type(r).__name__ for r in results] == ["Fingerprint", "Fingerprint"], results
    assert all(r.sha256 == want.sha256 for r in results if isinstance(r, Fingerprint))
    assert fingerprint(site.root / "inputs" / "data-x").sha256 == want.sha256
    assert staging_leftovers(site.root / "inputs") == []


_KILLED_COPY = """
import sys
from alignflow.config.hosts import Host
from alignflow.transport import copy_between, open_transport
host = Host.model_validate_json(sys.argv[1])
with open_transport(host) as t:
    copy_between(t, sys.argv[2], t, sys.argv[3], progress=lambda d, n: print(d, flush=True))
"""


def _kill_when(proc: subprocess.Popen[bytes], ready: callable, what: str) -> None:  # type: ignore[valid-type]
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, f"{what}: the process ended before it could be killed ({proc.returncode})"
        assert time.monotonic() < deadline, f"{what}: never happened"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the controller and its rsync/ssh children, as a dead machine would
    proc.wait()


def test_a_killed_copy_leaves_no_staging_after_the_next_copy_to_that_destination(
        site: Site, subprocess_env: dict[str, str]) -> None:
    src = _payload(site)
    inputs = site.root / "inputs"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_COPY, site.t.host.model_dump_json(), src,
                             f"{site.area}/inputs/data-x"], env=subprocess_env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: any(p.is_dir() and any(p.rglob("*.bin")) for p in inputs.glob(".af-partial-*")),
               "a copy's staging directory with data in it")
    time.sleep(0.5)  # an rsync receiver of the dead copy (on an SSH host) ends when its connection does
    assert staging_leftovers(inputs), "the killed copy left its staging directory (the situation under test)"
    fp = copy_between(site.t, src, site.t, f"{site.area}/inputs/data-x")
    assert fp.sha256 == site.t.sha256([src])[src].sha256
    assert staging_leftovers(inputs) == []
    assert sorted(p.name for p in inputs.iterdir()) == ["data-x"]


def test_a_copy_to_another_destination_leaves_that_staging_alone(site: Site, subprocess_env: dict[str, str]) -> None:
    """Only copies to the same destination clean up: a copy to `data-x2` has no business with `data-x`'s."""
    src = _payload(site)
    inputs = site.root / "inputs"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_COPY, site.t.host.model_dump_json(), src,
                             f"{site.area}/inputs/data-x"], env=subprocess_env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: any(inputs.glob(".af-partial-*")), "a copy's staging directory")
    left = staging_leftovers(inputs)
    copy_between(site.t, src, site.t, f"{site.area}/inputs/data-x2")
    assert staging_leftovers(inputs) == left


def test_a_killed_conversion_leaves_no_partial_after_the_next_conversion(tmp_path: Path,
                                                                         subprocess_env: dict[str, str]) -> None:
    import torch

    from tests.convert.synthetic import write_mindformers

    # one 128 MB tensor: the conversion streams it into its staging directory for long enough to be killed there
    write_mindformers(tmp_path / "base", {"w": torch.ones(32 << 20)})
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, "-m", "alignflow", "convert", "bf16", str(tmp_path / "base"), str(out / "bf16")]
    proc = subprocess.Popen(argv, env=subprocess_env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _kill_when(proc, lambda: bool(staging_leftovers(out)), "the conversion's staging directory")
    assert staging_leftovers(out), "the killed conversion left its .partial directory (the situation under test)"
    done = subprocess.run(argv, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert staging_leftovers(out) == []
    assert sorted(p.name for p in out.iterdir()) == ["bf16"]


def test_a_running_conversion_keeps_its_partial_while_another_destination_is_converted(
        tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """A `.partial` whose conversion still runs (it holds its flock) is never removed."""
    import fcntl

    out = tmp_path / "out"
    live = out / ".mg.abcdefgh.partial"
    live.mkdir(parents=True)
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a conversion in another process holds while it runs
    try:
        from alignflow.staging import sweep

        assert sweep(out, only_for="mg") == []
        assert live.is_dir()
    finally:
        os.close(fd)
    assert sweep(out, only_for="mg") == [live]
