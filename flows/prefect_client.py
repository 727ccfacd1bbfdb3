"""How alignflow's own processes reach Prefect: which API, Prefect's home under the state dir, no telemetry, links.

**Before Prefect is imported** (`use_state_dir_for_prefect`, called by every command that touches Prefect):
Prefect makes its home directory as it is imported (`prefect/context.py`: `settings.home.mkdir(...)`, default
`~/.prefect`), and in an interactive terminal with `DO_NOT_TRACK` unset its first import prints a telemetry notice,
writes `~/.prefect/.sdk_telemetry/` (device id, milestones) and sends usage events unless the server it talks to has
analytics off (`prefect/_internal/analytics/`); `PREFECT_SERVER_ANALYTICS_ENABLED=false` turns off only the
*server's* telemetry. So alignflow sets, unless the user set them:

- `PREFECT_HOME` = `<state>/prefect/home` (the owned server's home too); a profile the user keeps in
  `~/.prefect/profiles.toml` (a team server's `PREFECT_API_URL`) is still read, through `PREFECT_PROFILES_PATH` -
  read, never written;
- `DO_NOT_TRACK=1`, Prefect's client-side switch.

The flow-run subprocesses of `alignflow serve` and the jobs of local hosts inherit both.

**Which API** (`prefect_api`): a configured `PREFECT_API_URL`, else the kept server, else one started for the run
(flows/server.py). **Links**: `PREFECT_UI_URL` is the owned server's V2 UI, so the links Prefect builds (`View at`)
and those alignflow prints (`run_link`) open that server's page of the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignflow.errors import ConfigError
from flows.server import (
    ServerRecord,
    forget,
    healthy,
    kept_server,
    prefect_home,
    run_servers,
    server_for_run,
    start_kept,
    stop,
    sweep,
    ui_base,
)

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

log = logging.getLogger(__name__)


def prefect_environment(state: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` so that Prefect writes only under `state` and sends no telemetry."""
    updates: dict[str, str] = {}
    if not environ.get("PREFECT_HOME"):
        updates["PREFECT_HOME"] = str(prefect_home(state))
        home = environ.get("HOME")
        profiles = Path(home) / ".prefect" / "profiles.toml" if home else None
        if not environ.get("PREFECT_PROFILES_PATH") and profiles is not None and profiles.is_file():
            updates["PREFECT_PROFILES_PATH"] = str(profiles)
    if "DO_NOT_TRACK" not in environ:
        updates["DO_NOT_TRACK"] = "1"
    return updates


def use_state_dir_for_prefect(state: Path | None = None, environ: MutableMapping[str, str] | None = None) -> None:
    """Set `prefect_environment` in this process (before Prefect is imported: it reads its home once)."""
    from alignflow.state import state_dir, writable_dir

    env = os.environ if environ is None else environ
    state = state_dir(env) if state is None else state
    updates = prefect_environment(state, env)
    if "PREFECT_HOME" in updates:  # a read-only state dir: an error naming it (exit 2), not a traceback (issue 33)
        writable_dir(Path(updates["PREFECT_HOME"]))
    env.update(updates)


@dataclass(frozen=True, slots=True)
class PrefectApi:
    """The Prefect API a run talks to, and who provides it."""

    url: str
    source: str  # "PREFECT_API_URL" | "kept" | "per-run"
    server: ServerRecord | None = None


def check_reachable(url: str) -> None:
    if not healthy(url, timeout_s=10):
        raise ConfigError(f"{url}: the Prefect API does not answer (PREFECT_API_URL); start that server, or unset "
                          "PREFECT_API_URL and alignflow runs its own")


def configured_api_url() -> str | None:
    """`PREFECT_API_URL` as Prefect reads it (environment or profile)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


@contextlib.contextmanager
def prefect_api(state: Path, *, timeout_s: float | None = None,
                events: Callable[[str], None] | None = None) -> Iterator[PrefectApi]:
    """Make Prefect in this process (and its children) talk to a healthy API for the duration of the block.

    A configured `PREFECT_API_URL` (environment or Prefect profile) is used as it is, after a health check. Else
    the kept server, else a server started for this block and stopped when it ends (or when this process dies);
    `events` hears that this run waits for another one's server to start (`flows.server.server_for_run`).
    """
    configured = configured_api_url()
    if configured:
        check_reachable(configured)
        yield PrefectApi(configured, "PREFECT_API_URL")
        return
    sweep(state)
    record = server_for_run(state, timeout_s=timeout_s, events=events)
    if record.kept:
        with client_of(record):
            yield PrefectApi(record.url, "kept", record)
        return
    try:
        with client_of(record):
            try:
                yield PrefectApi(record.url, "per-run", record)
            finally:
                _drain_to(record)
    finally:
        stop(record)
        forget(state, record)


def _drain_to(record: ServerRecord) -> None:
    """Send the logs and events still queued in this process while their server is up (stopping it first leaves
    Prefect's workers retrying at exit: `--- Error logging to API --- All connection attempts failed`)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=30, at_exit=False)
        except Exception as exc:  # a worker that cannot drain must not fail a finished run
            log.debug("%s: draining %s failed: %s", record.url, worker.__name__, exc)


@contextlib.contextmanager
def client_of(record: ServerRecord) -> Iterator[None]:
    """While inside: Prefect in this process (and its children) uses the owned server `record`, API and UI."""
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    values = {"PREFECT_API_URL": record.url, "PREFECT_UI_URL": record.ui}
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)  # for child processes (detached jobs do not need it; hooks might)
    try:
        with temporary_settings(updates={PREFECT_API_URL: record.url, PREFECT_UI_URL: record.ui}):
            yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --- links to the UI -----------------------------------------------------------------------------------------------
def ui_url() -> str | None:
    """The base of the UI of the API this process talks to (Prefect's `PREFECT_UI_URL`; the owned servers' is
    their V2 UI)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().ui_url
    return str(url).rstrip("/") if url else None


def run_link(flow_run_id: object, base: str | None = None) -> str | None:
    """The UI page of a flow run (Prefect's own path: prefect/utilities/urls.py), under `base` or `ui_url()`."""
    base = base or ui_url()
    return f"{base}/runs/flow-run/{flow_run_id}" if base else None


@contextlib.contextmanager
def _client(api_url: str) -> Iterator[Any]:
    """Prefect's own client of the API at `api_url` (its settings: a team server's auth string or key apply)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        yield client


def find_flow_run(api_url: str, run_id: str) -> FlowRun | None:
    """The newest flow run (Prefect's `FlowRun`) of alignflow run `run_id` on the server at `api_url` (runs are
    named `align-<experiment>-<run id>[-rerun-<step> | -reproduce]`, flows/states.py); None if it has none there."""
    import httpx
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import PrefectException

    try:
        with _client(api_url) as client:
            found = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=run_id)),
                                          sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=20)
    except (PrefectException, httpx.HTTPError, OSError, ValueError) as exc:
        raise ConfigError(f"{api_url}: reading its flow runs failed ({exc})") from None
    return next((f for f in found if f.name.endswith(f"-{run_id}") or f"-{run_id}-" in f.name), None)


def cancel_flow_run(api_url: str, run_id: str, *, message: str) -> None:
    """Make the flow run of alignflow run `run_id` `Cancelled` (Prefect recorded a Ctrl-C that reached its engine
    as `Crashed`); best effort: the store's record is the one that counts."""
    import httpx
    from prefect.exceptions import PrefectException
    from prefect.states import Cancelled

    try:
        found = find_flow_run(api_url, run_id)
        if found is None or (found.state is not None and found.state.is_cancelled()):
            return
        with _client(api_url) as client:
            client.set_flow_run_state(found.id, Cancelled(message=message), force=True)
    except (ConfigError, PrefectException, httpx.HTTPError, OSError) as exc:
        log.warning("run %s: its flow run could not be marked cancelled: %s", run_id, exc)


@dataclass(frozen=True, slots=True)
class UiServer:
    """The Prefect server whose UI `alignflow ui` opens."""

    api_url: str
    ui: str
    source: str  # "PREFECT_API_URL" | "kept" | "per-run" | "started"
    server: ServerRecord | None = None


def ui_server(state: Path, *, timeout_s: float | None = None) -> UiServer:
    """The configured API's UI, else the kept server's, else that of a run in progress; else a kept server is
    started (every owned server keeps its flow runs in `<state>/prefect/home`, so any of them shows every run)."""
    configured = configured_api_url()
    if configured:
        check_reachable(configured)
        return UiServer(configured, ui_url() or ui_base(configured), "PREFECT_API_URL")
    sweep(state)
    record = kept_server(state)
    if record is not None and healthy(record.url):
        return UiServer(record.url, record.ui, "kept", record)
    for _, running in run_servers(state):
        if running.alive() and healthy(running.url):
            return UiServer(running.url, running.ui, "per-run", running)
    record, _ = start_kept(state, timeout_s=timeout_s)
    return UiServer(record.url, record.ui, "started", record)
