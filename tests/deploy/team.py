"""The team topology of docker/compose.yaml, without Docker: real processes on this machine.

```
PostgreSQL (tests/lab/postgres.py)  -- database `prefect`  <-- prefect server start (127.0.0.1:<port>, UI + API)
                                    -- database `alignflow` <-- the alignflow store (ALIGNFLOW_DB_URL)
alignflow serve (subprocess)  --PREFECT_API_URL-->  the server; runs each flow run in its own subprocess
test  --REST, as the UI's "Run" button-->  POST /api/deployments/{id}/create_flow_run
```

Every process is started in its own session and stopped with SIGTERM (then SIGKILL after a grace period) by
process group, so nothing outlives the test module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

FINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A child process in its own session, its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(name, popen, log)

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = 60.0) -> int:
        """SIGTERM the process (then, after `grace_s`, SIGKILL its whole group); returns its exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # leftovers of the group (flow-run subprocesses, jobs)
        return self.popen.wait(30)


def wait_until(what: str, check: Any, *, timeout_s: float, proc: Proc | None = None, every_s: float = 0.5) -> Any:
    """Poll `check()` until it returns something truthy; fail with the process's log tail otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if proc is not None and not proc.alive():
            raise AssertionError(f"{proc.name} exited {proc.popen.returncode} while waiting for {what}:\n{proc.tail()}")
        if time.monotonic() > deadline:
            tail = f":\n{proc.tail()}" if proc is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{tail}")
        time.sleep(every_s)


@dataclass
class PrefectServer:
    """`prefect server start` bound to 127.0.0.1, its database on PostgreSQL."""

    proc: Proc
    port: int
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=f"{self.url}/api", timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    @classmethod
    def start(cls, *, database_url: str, home: Path, env: dict[str, str], log: Path) -> PrefectServer:
        port = free_port()
        server_env = {**env, "PREFECT_HOME": str(home), "PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url,
                      "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
                      "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"}  # a 503's cause in the server log
        proc = Proc.start("prefect server", [sys.executable, "-m", "prefect", "server", "start", "--host",
                                             "127.0.0.1", "--port", str(port)], env=server_env, cwd=home, log=log)
        server = cls(proc, port)
        wait_until("the Prefect server's /api/health", server.healthy, timeout_s=180, proc=proc)
        return server

    def healthy(self) -> bool:
        try:
            return bool(self.client.get("/health").json() is True)
        except (httpx.HTTPError, ValueError):
            return False

    def close(self) -> None:
        self.client.close()
        self.proc.stop()

    # --- REST, as the UI calls it -------------------------------------------------------------------------------
    def deployment(self, flow_name: str, name: str) -> dict[str, Any] | None:
        r = self.client.get(f"/deployments/name/{flow_name}/{name}")
        return r.json() if r.status_code == 200 else None

    def run_from_ui(self, deployment_id: str, parameters: dict[str, Any]) -> httpx.Response:
        """The body the UI's run dialog sends (Prefect 3.9 V2 UI: parameters, schema enforcement, SCHEDULED)."""
        body = {"parameters": parameters, "enforce_parameter_schema": True,
                "state": {"type": "SCHEDULED", "message": "Run from the Prefect UI",
                          "state_details": {"deferred": False, "untrackable_result": False,
                                            "pause_reschedule": False}}}
        return self.client.post(f"/deployments/{deployment_id}/create_flow_run", json=body)

    def flow_run(self, flow_run_id: str) -> dict[str, Any]:
        r = self.client.get(f"/flow_runs/{flow_run_id}")
        r.raise_for_status()
        return dict(r.json())

    def wait_final(self, flow_run_id: str, *, timeout_s: float, proc: Proc | None = None) -> dict[str, Any]:
        def final() -> dict[str, Any] | None:
            run = self.flow_run(flow_run_id)
            return run if run["state_type"] in FINAL_STATES else None

        return dict(wait_until(f"flow run {flow_run_id} to finish", final, timeout_s=timeout_s, proc=proc,
                               every_s=1.0))

    def artifacts(self, flow_run_id: str) -> list[dict[str, Any]]:
        r = self.client.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
        r.raise_for_status()
        return list(r.json())

    def child_runs(self, flow_run_id: str) -> list[dict[str, Any]]:
        """Subflow runs of a flow run (their parent task run belongs to it)."""
        r = self.client.post("/flow_runs/filter", json={
            "flow_runs": {"parent_flow_run_id": {"operator": "and_", "any_": [flow_run_id]}}})
        r.raise_for_status()
        return list(r.json())

    def logs(self, flow_run_id: str) -> str:
        r = self.client.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200})
        r.raise_for_status()
        return "\n".join(entry["message"] for entry in r.json())
