"""The Prefect server alignflow owns when no `PREFECT_API_URL` is configured.

Prefect's own fallback, a temporary in-process server, gives up after 20 s (`Timed out while attempting to connect
to ephemeral Prefect API server`): on a fresh `PREFECT_HOME` its database migrations alone take longer on a busy
2-core machine, and its telemetry and connection-pool noise ends up in the run's output. alignflow instead runs a
real `prefect server start` under the state directory and waits for its health endpoint as long as it takes
(`ALIGNFLOW_PREFECT_START_TIMEOUT_S`, default 300 s):

```
<state>/prefect/home/          PREFECT_HOME of the owned server: its own database (prefect.db) and storage
<state>/prefect/server.json    the kept server (`alignflow server start`): url, pid, process start time, boot id
<state>/prefect/run-servers/   one record per server started for a single run, naming the run's controller
<state>/prefect/*.log          each server's output
```

Two modes:
- **kept** (`alignflow server start`): a detached server that every later run reuses (a cached run then costs
  seconds, not a server start); `alignflow server status` shows it, `alignflow server stop` ends it.
- **per run** (what `alignflow run` does when no kept server is up): a server that lives as long as the run's
  controller. It is the controller's child, killed by the kernel when its parent dies (Linux `PR_SET_PDEATHSIG`
  with SIGKILL, prctl(2)), stopped by the controller when the run ends, and - should both be killed at once -
  stopped by the next alignflow command that looks for a Prefect server (`sweep`).

Telemetry is off (`PREFECT_SERVER_ANALYTICS_ENABLED=false`, and `DO_NOT_TRACK=1` for the Prefect client code the
server runs; alignflow's own processes: flows/environment.py). The server's INFO logs go to its log file, never to
the run's terminal.

**Its UI talks to its own API.** The UI asks the server where the API is (`GET /ui-settings`, whose `api_url` is
Prefect's `PREFECT_SERVER_UI_API_URL`) and calls that. Unset, Prefect derives it from `PREFECT_SERVER_API_HOST` and
`PREFECT_SERVER_API_PORT` (prefect/settings/models/root.py), not from `--port`: a server on any other port than
4200 sent its UI to `http://127.0.0.1:4200/api` - "Unable to connect to Prefect server", or the runs of whatever
other Prefect server listens there. So each owned server is told its own URL, and `PREFECT_UI_URL` (the base of
the links Prefect builds: `View at ...`, the nightly alert's link) is its V2 UI.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from alignflow import controller
from alignflow.errors import ConfigError
from alignflow.once import exclusive
from alignflow.state import writable_dir

log = logging.getLogger(__name__)

START_TIMEOUT_ENV = "ALIGNFLOW_PREFECT_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 300.0
STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """A Prefect server alignflow started: where it listens and which process it is."""

    url: str  # the API URL, http://127.0.0.1:PORT/api
    port: int
    process: dict[str, Any]  # ControllerIdentity of the server process (its pid is its process group too)
    kept: bool
    log: str
    owner: dict[str, Any] | None = None  # per-run servers: the controller whose run it serves
    started_at: float = 0.0

    @property
    def identity(self) -> controller.ControllerIdentity:
        return controller.ControllerIdentity.from_dict(self.process)

    @property
    def ui(self) -> str:
        """The base URL of its UI (Prefect's V2 UI, the default of 3.9)."""
        return ui_base(self.url)

    def alive(self) -> bool:
        return controller.liveness(self.identity) == "alive"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def read(cls, path: Path) -> ServerRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def ui_base(api_url: str) -> str:
    """The V2 UI of the server whose API is `api_url` (`http://HOST:PORT/api` -> `http://HOST:PORT/v2`)."""
    return api_url.rstrip("/").removesuffix("/api") + "/v2"


def server_dir(state: Path) -> Path:
    return state / "prefect"


def prefect_home(state: Path) -> Path:
    return server_dir(state) / "home"


def kept_path(state: Path) -> Path:
    return server_dir(state) / "server.json"


def start_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get(START_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{START_TIMEOUT_ENV}={raw!r}: not a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"{START_TIMEOUT_ENV}={raw!r}: must be positive")
    return value


def ui_api_url(url: str, *, timeout_s: float = 3.0) -> str | None:
    """The API URL the UI of the server at `url` (its API) calls, as `GET /ui-settings` tells it; None if unknown."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/').removesuffix('/api')}/ui-settings", timeout=timeout_s) as resp:
            found = json.loads(resp.read().decode() or "null")
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return str(found["api_url"]) if isinstance(found, dict) and found.get("api_url") else None


def healthy(url: str, *, timeout_s: float = 3.0) -> bool:
    """True when `<url>/health` answers `true` (the Prefect API's health endpoint)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as resp:
            return bool(json.loads(resp.read().decode() or "null") is True)
    except (OSError, ValueError, urllib.error.URLError):
        return False


def kept_server(state: Path) -> ServerRecord | None:
    """The kept server if its process is alive (a stale record is removed)."""
    record = ServerRecord.read(kept_path(state))
    if record is None:
        return None
    if not record.alive():
        with contextlib.suppress(FileNotFoundError):
            kept_path(state).unlink()
        return None
    return record


def run_servers(state: Path) -> list[tuple[Path, ServerRecord]]:
    folder = server_dir(state) / "run-servers"
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = ServerRecord.read(path)
        if record is not None:
            found.append((path, record))
    return found


def sweep(state: Path) -> list[ServerRecord]:
    """Stop per-run servers whose controller is gone (both were killed at once); drop records of dead servers."""
    stopped = []
    for path, record in run_servers(state):
        owner = None if record.owner is None else controller.ControllerIdentity.from_dict(record.owner)
        if not record.alive():
            path.unlink(missing_ok=True)
        elif owner is not None and controller.liveness(owner) == "dead":
            stop(record)
            path.unlink(missing_ok=True)
            stopped.append(record)
    return stopped


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(state: Path, port: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an owned server on `port`: its own PREFECT_HOME (hence database), its UI pointed at its
    own API, telemetry off, quiet logs."""
    env = dict(os.environ if environ is None else environ)
    for key in [k for k in env if k.startswith(("PREFECT_API_", "PREFECT_UI_", "PREFECT_SERVER_UI_"))
                or k in ("PREFECT_PROFILE", "PREFECT_PROFILES_PATH")]:
        del env[key]  # the server is not a client of some other API, nor its UI some other server's
    api = f"http://127.0.0.1:{port}/api"
    env.update(PREFECT_HOME=str(prefect_home(state)), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1",
               PREFECT_SERVER_UI_API_URL=api, PREFECT_UI_URL=ui_base(api),
               PREFECT_SERVER_LOGGING_LEVEL="WARNING", PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_CLI_PROMPT="false", PYTHONUNBUFFERED="1")
    return env


def _die_with_parent(parent: int) -> None:
    """preexec_fn of a per-run server: SIGKILL when the controller dies, even by SIGKILL (Linux).

    Not SIGTERM: uvicorn takes SIGTERM over before Prefect's start-up (the database migrations) and finishes that
    start-up before it stops - 13-15 s on 2 cores, during which the server outlived its controller. The server has
    no child processes and its SQLite database survives a kill (tests/flows/test_server.py)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def start(state: Path, *, kept: bool, timeout_s: float | None = None) -> ServerRecord:
    """Start `prefect server start` on a free loopback port and wait until it is healthy (a port taken between
    choosing it and the server's bind is chosen again, twice at most)."""
    timeout_s = start_timeout_s() if timeout_s is None else timeout_s
    for attempt in range(3):
        try:
            return _start_on(state, _free_port(), kept=kept, timeout_s=timeout_s)
        except _PortTaken:
            if attempt == 2:
                raise ConfigError("the Prefect server alignflow started found its port taken three times; "
                                  "set PREFECT_API_URL to a running server") from None
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    pass


def _start_on(state: Path, port: int, *, kept: bool, timeout_s: float) -> ServerRecord:
    folder = server_dir(state)
    writable_dir(prefect_home(state))  # a read-only state dir: an error naming it, not a traceback (issue 33)
    log_path = folder / f"server-{port}.log"
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
            "--analytics-off"]
    parent = os.getpid()
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                env=server_env(state, port), cwd=str(folder), start_new_session=True,
                                preexec_fn=None if kept else lambda: _die_with_parent(parent))
    record = ServerRecord(url=f"http://127.0.0.1:{port}/api", port=port,
                          process=controller.current(pid=proc.pid).to_dict(), kept=kept, log=str(log_path),
                          owner=None if kept else controller.current().to_dict(), started_at=time.time())
    if kept:
        kept_path(state).write_text(record.to_json())
    else:
        (folder / "run-servers").mkdir(parents=True, exist_ok=True)
        (folder / "run-servers" / f"{proc.pid}.json").write_text(record.to_json())
    try:
        _wait_healthy(record, proc, timeout_s)
    except BaseException:
        stop(record)
        forget(state, record)
        raise
    return record


def _wait_healthy(record: ServerRecord, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if healthy(record.url):
            return
        code = proc.poll()
        if code is not None and "already in use" in _tail(record.log):
            raise _PortTaken
        if code is not None:
            raise ConfigError(f"the Prefect server alignflow started exited ({code}) before it answered on "
                              f"{record.url}:\n{_tail(record.log)}\nits log: {record.log}")
        if time.monotonic() > deadline:
            raise ConfigError(
                f"the Prefect server alignflow started did not answer {record.url}/health within {timeout_s:.0f} s "
                f"(its log: {record.log}); on a busy machine give it longer with {START_TIMEOUT_ENV}=600, or "
                "point PREFECT_API_URL at a running server")
        time.sleep(0.5)


def _tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text[-lines:])


def stop(record: ServerRecord, *, grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM the server's process group, SIGKILL after `grace_s`; True if it was running."""
    ident = record.identity
    if controller.liveness(ident) != "alive":
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(ident.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and controller.liveness(ident) == "alive":
        _reap(ident.pid)
        time.sleep(0.1)
    if controller.liveness(ident) == "alive":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ident.pid, signal.SIGKILL)
    _reap(ident.pid)
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def forget(state: Path, record: ServerRecord) -> None:
    path = kept_path(state) if record.kept else server_dir(state) / "run-servers" / f"{record.identity.pid}.json"
    current = ServerRecord.read(path)
    if current is not None and current.identity == record.identity:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _lock(state: Path, events: Callable[[str], None] | None = None) -> Iterator[None]:
    """The servers' lock (`alignflow.once.exclusive`), held from the look for a running server until the one started
    answers: a second `alignflow server start` waits, saying for whom, then finds the first one's server; a second
    run's server starts once the first one's has migrated their shared database (issue 49)."""
    writable_dir(server_dir(state))
    with exclusive(server_dir(state) / "lock", what=f"the Prefect server of {server_dir(state)}", events=events):
        yield


def server_for_run(state: Path, *, timeout_s: float | None = None,
                   events: Callable[[str], None] | None = None) -> ServerRecord:
    """The kept server when one answers, else a per-run server started now (its record's `kept` says which).

    Every owned server keeps its flow runs in `<state>/prefect/home` and migrates that database as it starts: two
    runs starting their servers at once on a fresh state dir both migrated it, and the second server died
    (`duplicate column name: has_data`, its run exit 2). Starts are therefore one at a time, under the servers'
    lock; the second run's server finds the database migrated and starts in seconds."""
    with _lock(state, events):
        record = kept_server(state)
        if record is not None and healthy(record.url):
            return record
        return start(state, kept=False, timeout_s=timeout_s)


def start_kept(state: Path, *, timeout_s: float | None = None,
               events: Callable[[str], None] | None = None) -> tuple[ServerRecord, bool]:
    """The kept server, started if none is running; returns (record, started now). Two at once start one server:
    the second waits for the first's (saying so through `events`) and returns it."""
    with _lock(state, events):
        record = kept_server(state)
        if record is not None:
            return record, False
        return start(state, kept=True, timeout_s=timeout_s), True


def stop_kept(state: Path) -> ServerRecord | None:
    with _lock(state):
        record = kept_server(state)
        if record is None:
            return None
        stop(record)
        forget(state, record)
        return record
