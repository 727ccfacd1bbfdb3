"""The Prefect server alignflow owns: kept across runs, or one per run that dies with its controller (kill -9 too).

Real `prefect server start` processes under a fresh state dir and a brand-new PREFECT_HOME, started the way
`alignflow run` starts them; nothing here uses Prefect's test harness.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from alignflow import controller
from flows import server

pytestmark = pytest.mark.integration


@pytest.fixture
def env(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in subprocess_env.items() if not k.startswith("PREFECT_API")}
    return {**base, "ALIGNFLOW_STATE_DIR": str(tmp_path / "state"), "PREFECT_HOME": str(tmp_path / "prefect-home"),
            "HOME": str(tmp_path / "home")}


def _cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False, cwd=cwd)


def _gone(ident: controller.ControllerIdentity, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if controller.liveness(ident) == "dead":
            return True
        time.sleep(0.2)
    return False


def test_a_kept_server_is_started_once_reused_shown_and_stopped(env: dict[str, str], tmp_path: Path) -> None:
    started = _cli(env, "server", "start")
    assert started.returncode == 0, started.stderr
    state = Path(env["ALIGNFLOW_STATE_DIR"])
    record = server.kept_server(state)
    assert record is not None
    try:
        assert server.healthy(record.url)
        assert (state / "prefect" / "home" / "prefect.db").is_file()  # its own database, under the state dir
        # its UI calls its own API (GET /ui-settings): on its random port, not Prefect's default 4200 (issue 40)
        assert server.ui_api_url(record.url) == record.url
        again = _cli(env, "server", "start")
        assert "already running" in again.stdout
        assert server.kept_server(state) == record
        status = _cli(env, "server", "status", "--json")
        assert status.returncode == 0
        (row,) = json.loads(status.stdout)
        assert (row["mode"], row["healthy"], row["pid"]) == ("kept", True, record.identity.pid)
        assert (row["ui"], row["ui_api_url"]) == (f"{record.ui}/runs", record.url)
        assert f"UI {record.ui}/runs\n" in started.stdout
        assert "telemetry" not in Path(record.log).read_text().lower()
    finally:
        stopped = _cli(env, "server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert _gone(record.identity, 30)
    assert _cli(env, "server", "status").returncode == 1


PER_RUN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from flows.prefect_client import prefect_api
    with prefect_api(Path(sys.argv[1])) as api:
        print(api.source, api.url, api.server.identity.pid, flush=True)
        time.sleep(600)
""")


@contextlib.contextmanager
def _per_run_controller(env: dict[str, str], state: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that runs under a per-run server (PER_RUN); afterwards it is killed, and a server it left behind
    (a failed assertion) stopped."""
    proc = subprocess.Popen([sys.executable, "-c", PER_RUN, str(state)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        for _, left in server.run_servers(state):
            server.stop(left)


def test_a_per_run_server_dies_with_its_controller_even_by_kill_9(env: dict[str, str], tmp_path: Path) -> None:
    state = Path(env["ALIGNFLOW_STATE_DIR"])
    with _per_run_controller(env, state) as proc:
        assert proc.stdout is not None
        source, url, pid = proc.stdout.readline().split()
        assert source == "per-run"
        assert server.healthy(url)
        assert server.ui_api_url(url) == url
        ((_, record),) = server.run_servers(state)
        assert record.identity.pid == int(pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _gone(record.identity, 60), "the run's Prefect server outlived its controller"
    assert _cli(env, "server", "status").returncode == 1
    assert server.run_servers(state) == []  # the record of the dead server was swept


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (`SigCgt` in /proc/PID/status, proc(5))."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def test_a_per_run_server_killed_with_its_controller_during_its_start_up_is_gone_at_once(
        env: dict[str, str], tmp_path: Path) -> None:
    """The controller killed while its server is still migrating a new database: a server told SIGTERM then
    finishes starting before it stops (13-15 s, measured on 2 cores), so for that while it outlived its controller
    (the crash test caught one). It must be gone at once."""
    state = Path(env["ALIGNFLOW_STATE_DIR"])
    records: list[tuple[Path, server.ServerRecord]] = []
    with _per_run_controller(env, state) as proc:
        deadline = time.monotonic() + 120
        while not records and time.monotonic() < deadline:
            records = server.run_servers(state)
            time.sleep(0.05)
        ((_, record),) = records
        # uvicorn takes over SIGTERM (to shut down gracefully) before it runs Prefect's start-up: kill the
        # controller in that window, once the server catches SIGTERM and before it answers
        while not _catches_sigterm(record.identity.pid) and time.monotonic() < deadline:
            assert controller.liveness(record.identity) == "alive", Path(record.log).read_text(errors="replace")
            time.sleep(0.02)
        assert not server.healthy(record.url), "the server was up before the kill: this tests nothing"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _gone(record.identity, 3), "the run's Prefect server outlived its controller, still starting"


def test_a_server_that_does_not_answer_in_time_fails_the_run_before_it_is_recorded(env: dict[str, str],
                                                                                    repo_root: Path) -> None:
    env[server.START_TIMEOUT_ENV] = "0.5"
    done = _cli(env, "run", "demo", cwd=repo_root)
    assert done.returncode == 2, done.stderr
    assert "did not answer" in done.stderr
    assert f"{server.START_TIMEOUT_ENV}=600" in done.stderr  # the fix
    state = Path(env["ALIGNFLOW_STATE_DIR"])
    assert not (state / "store.sqlite").exists()
    assert server.run_servers(state) == []  # the slow server was stopped, not left behind


def test_an_unreachable_prefect_api_url_fails_the_run_before_it_is_recorded(env: dict[str, str],
                                                                           repo_root: Path) -> None:
    env["PREFECT_API_URL"] = "http://127.0.0.1:9/api"  # discard port: nothing answers
    done = _cli(env, "run", "demo", cwd=repo_root)
    assert done.returncode == 2, done.stderr
    assert "the Prefect API does not answer (PREFECT_API_URL)" in done.stderr
    assert not (Path(env["ALIGNFLOW_STATE_DIR"]) / "store.sqlite").exists()
