"""Deployments of alignflow's flows: the UI launch of the alignment flow and the nightly regression on a cron.

Two ways to run them (docs/orchestration.md#deployments):

- `alignflow serve` (`build_deployments` + `serve_deployments`): one long-running process on the controller —
  the host that holds the SSH keys, `hosts.yaml` and the repository — registers both deployments and runs each
  flow run in a subprocess. `pause_on_shutdown=False`: by default Prefect pauses every schedule when `serve`
  stops, so a plain restart (systemd, `docker compose restart`) would silently stop the nightly
  (docs/orchestration.md#g6-serve-pauses-schedules-on-shutdown). SIGTERM
  stops it cleanly: in-flight flow runs are cancelled, and their cancellation hooks kill the remote jobs.
- `prefect.yaml` + `prefect deploy --all` + `prefect worker start --pool NAME` (a process work pool): the same
  flows, loaded by the worker from this module's entry points `alignment` and `nightly_regression`, built on
  first access from the working directory (`$ALIGNFLOW_EXPERIMENTS_DIR` or `experiments/`, `$ALIGNFLOW_HOSTS` or
  `hosts.yaml`, `$ALIGNFLOW_NIGHTLY` or `nightly.yaml` when present). Nothing is read at import time.

What `serve` checks is `alignflow.config.catalog.check_serving` (and `alignflow validate --hosts` runs the same):
experiments whose hosts the inventory lacks are not served, with the reason, instead of stopping it. Beside the
deployments it serves the state dir's reports read-only over http (`alignflow.reportserver`; unless
`ALIGNFLOW_REPORTS_URL` says they are served elsewhere) and installs the nightly's alert (`flows.alerts`).

No `from __future__ import annotations` in this module (docs/orchestration.md#g4-no-future-annotations-in-flow-modules).
"""

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from alignflow.config.catalog import ExperimentCatalog, NightlySettings, check_serving
from alignflow.errors import ConfigError

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.client.schemas.objects import State
    from prefect.runner import Runner
    from prefect.schedules import Schedule

log = logging.getLogger(__name__)
ALIGNMENT_DEPLOYMENT = "launch"
NIGHTLY_DEPLOYMENT = "nightly"
NIGHTLY_SCHEDULE_SLUG = "nightly"


@dataclass(frozen=True)
class ServeSpec:
    """Everything the deployments are built from, validated (`load_serve_spec`)."""

    catalog: ExperimentCatalog
    hosts: Path
    nightly: NightlySettings
    nightly_source: str
    tags: tuple[str, ...] = field(default=("alignflow",))


def load_serve_spec(experiments_dir: str | Path, hosts: str | Path, nightly: str | Path | None = None, *,
                    cron: str | None = None, timezone: str | None = None,
                    nightly_experiments: list[str] | None = None) -> ServeSpec:
    """Read and check the catalog, the inventory and the nightly settings; the options override the file."""
    checked = check_serving(experiments_dir, hosts, nightly, nightly_experiments=nightly_experiments)
    settings = checked.nightly
    updates: dict[str, Any] = {k: v for k, v in (("cron", cron), ("timezone", timezone)) if v}
    if updates:
        try:
            settings = NightlySettings.model_validate({**settings.model_dump(), **updates})
        except ValidationError as exc:
            raise ConfigError([("", None, f"--{str(e['loc'][0]).replace('_', '-')}: {_message(e['msg'])}")
                               for e in exc.errors()]) from None
    file = checked.nightly_source
    nightly_schedule(settings, source="--cron/--timezone" if cron or timezone else file)
    return ServeSpec(catalog=checked.catalog, hosts=Path(hosts).expanduser().resolve(), nightly=settings,
                     nightly_source=file)


def _message(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def nightly_schedule(settings: NightlySettings, *, source: str = "nightly settings") -> "Schedule":
    """The nightly's `Cron` schedule, its time zone explicit (serve's `cron=` keyword would store none)."""
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron

    try:
        CronSchedule(cron=settings.cron, timezone=settings.timezone)
    except ValidationError as exc:
        raise ConfigError(f"{source}: cron {settings.cron!r} ({settings.timezone}): "
                          f"{'; '.join(_message(e['msg']) for e in exc.errors())}") from None
    return Cron(settings.cron, timezone=settings.timezone, slug=NIGHTLY_SCHEDULE_SLUG)


@dataclass(frozen=True)
class ServedFlow:
    """A flow object and the deployment options it is served with."""

    flow: Any
    name: str
    options: dict[str, Any]


def served_flows(spec: ServeSpec) -> list[ServedFlow]:
    """`alignment/launch` (on demand, from the UI form) and `nightly-regression/nightly` (cron)."""
    from flows.launch import build_alignment_flow
    from flows.nightly import build_nightly_flow

    names = ", ".join(spec.catalog.names)
    return [
        ServedFlow(build_alignment_flow(spec.catalog, spec.hosts), ALIGNMENT_DEPLOYMENT, {
            "tags": list(spec.tags), "enforce_parameter_schema": True,
            "description": f"Run one alignment experiment ({names}) on the hosts of {spec.hosts.name}."}),
        ServedFlow(build_nightly_flow(spec.catalog, spec.hosts, spec.nightly), NIGHTLY_DEPLOYMENT, {
            "tags": [*spec.tags, "nightly"], "enforce_parameter_schema": True, "concurrency_limit": 1,
            "schedules": [nightly_schedule(spec.nightly, source=spec.nightly_source)],
            "description": f"Nightly regression check at {spec.nightly.cron!r} ({spec.nightly.timezone}); "
                           "fails when an experiment regressed against its last passing run."}),
    ]


class ScheduleView(BaseModel):
    cron: str
    timezone: str


class UnservedView(BaseModel):
    experiment: str
    path: str
    reasons: list[str]


class DeploymentView(BaseModel):
    """One deployment `serve` registers, as `serve --dry-run --json` prints it."""

    model_config = ConfigDict(frozen=True, serialize_by_alias=True)

    name: str
    description: str
    schedules: list[ScheduleView]
    parameters: list[str]
    form_schema: dict[str, JsonValue] = Field(serialization_alias="schema")  # what the UI renders its form from
    not_served: list[UnservedView]


def describe(spec: ServeSpec) -> list[DeploymentView]:
    """What `serve` registers: name, schedules, description and the parameter schema the UI renders its form from
    (`alignflow serve --dry-run`)."""
    from prefect.utilities.callables import parameter_schema

    out = []
    unserved = [UnservedView(experiment=u.name, path=str(u.path), reasons=list(u.reasons))
                for u in spec.catalog.unserved]
    for served in served_flows(spec):
        schema = parameter_schema(served.flow).model_dump()
        out.append(DeploymentView(
            name=f"{served.flow.name}/{served.name}", description=served.options["description"],
            schedules=[ScheduleView(cron=s.cron, timezone=s.timezone) for s in served.options.get("schedules", [])],
            parameters=list(schema.get("properties", {})), form_schema=schema, not_served=unserved))
    return out


SERVE_POLL_S = 2.0


def poll_seconds() -> float | None:
    """How often `serve` asks the server for flow runs to start (and for runs being cancelled): every 2 s, unless
    the user set Prefect's `PREFECT_RUNNER_POLL_FREQUENCY` (environment or profile; None: Prefect's value).

    Prefect's default is 10 s, sized for many runners on one server: a run submitted from the UI's form then sat
    Scheduled for up to 10 s before anything happened (5 s on average), and a Cancel took as long to reach its
    job. `serve` is one runner per team, its poll a single indexed query.
    """
    from prefect.settings import get_current_settings

    return None if "poll_frequency" in get_current_settings().runner.model_fields_set else SERVE_POLL_S


def serve_deployments(spec: ServeSpec, *, limit: int | None = None) -> None:
    """Register the deployments and run their flow runs until SIGTERM / Ctrl-C (schedules stay active).

    Each flow is added to the runner as the object built here (`Runner.add_flow`), so a flow run executes exactly
    that object in a subprocess; `prefect.serve(*deployments)` would instead re-import each flow from its
    entrypoint in `python -m prefect.engine`, where a flow made per catalog does not exist.
    """
    import asyncio

    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner

    from flows.alerts import install_alert

    install_alert(spec.nightly.alert)
    runner = Runner(name="alignflow-serve", pause_on_shutdown=False, limit=limit, query_seconds=poll_seconds())
    for served in served_flows(spec):
        runner.add_flow(served.flow, name=served.name, **served.options)
    previous, done = _stop_on_ctrl_c(runner), threading.Event()
    threading.Thread(target=_stop_within, args=(runner, STOP_GRACE_S, done), name="alignflow-serve-stop",
                     daemon=True).start()
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, TerminationSignal) as exc:
        log.info("%s: stopping", type(exc).__name__)
    finally:
        done.set()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


STOP_GRACE_S = 45.0
"""How long `serve` may take to stop once told to (Ctrl-C, SIGTERM): in-flight flow runs are cancelled and their
hooks kill the remote jobs (Prefect gives a flow-run process 30 s after its SIGTERM). Past it, serve kills what it
started itself and exits 130."""


def _stop_on_ctrl_c(runner: "Runner") -> Any:
    """Ctrl-C stops `serve` as SIGTERM does (what Prefect's `Runner.handle_sigterm` does: the runner's `astop` on
    its own loop, in-flight runs cancelled, the polling ended); a second Ctrl-C raises KeyboardInterrupt at once.
    Without this, asyncio cancelled the runner's task at whatever await it stood, and under load a Ctrl-C right as a
    flow run ended left `serve` running for minutes. Returns the handler it replaced (None: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    pressed: list[bool] = []

    def on_ctrl_c(signum: int, frame: Any) -> None:
        if pressed or not runner.started or runner._loop is None:
            signal.default_int_handler(signum, frame)
        pressed.append(True)
        log.warning("Ctrl-C: stopping (in-flight runs are cancelled; Ctrl-C again to stop at once)")
        runner.stopping = True
        runner.execute_in_background(runner.astop)

    return signal.signal(signal.SIGINT, on_ctrl_c)


def _stop_within(runner: "Runner", grace_s: float, done: threading.Event) -> None:
    """Watch the runner (a daemon thread) until `done`: once it is stopping, give it `grace_s`; a runner still
    stopping then is stuck: the Python stacks of every thread go to stderr (what it waited on), the processes serve
    started are killed (no orphan flow run), and the process exits 130."""
    import faulthandler

    while not runner.stopping:
        if done.wait(0.5):
            return
    if done.wait(grace_s):
        return
    log.error("serve did not stop within %.0f s of being told to; its threads' stacks follow, then it exits", grace_s)
    faulthandler.dump_traceback(all_threads=True)
    from alignflow.controller import descendants

    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    sys.stderr.flush()
    os._exit(130)



REPORTS_PORT = 4201  # beside Prefect's 4200


@contextmanager
def serving_reports(state: Path, *, bind: str, port: int | None, public_url: str | None) -> Iterator[str]:
    """The base URL of the state dir's reports while inside: `$ALIGNFLOW_REPORTS_URL` when something else serves
    them (compose's nginx), else a read-only server of `<state>/reports` started here, on `port` (None: 4201, or
    any free port when 4201 is taken: a second `serve` on the machine, another tool). The URL is exported to this
    process's environment, which every flow-run subprocess inherits, and published in the state dir for `alignflow
    run` on the same controller."""
    from alignflow.reportserver import REPORTS_URL_ENV, ReportServer, publish_url, reports_dir, withdraw_url

    given = os.environ.get(REPORTS_URL_ENV)
    if given:
        yield given
        return
    try:
        server = ReportServer(reports_dir(state), host=bind, port=REPORTS_PORT if port is None else port).start()
    except ConfigError:
        if port is not None:
            raise
        log.warning("reports server: port %d is taken; serving on a free port", REPORTS_PORT)
        server = ReportServer(reports_dir(state), host=bind, port=0).start()
    host = server.host if server.host not in ("0.0.0.0", "::") else socket.getfqdn()
    url = (public_url or f"http://{host}:{server.port}").rstrip("/")
    os.environ[REPORTS_URL_ENV] = url
    publish_url(state, url)
    try:
        yield url
    finally:
        withdraw_url(state, url)
        os.environ.pop(REPORTS_URL_ENV, None)
        server.close()


_POOL_FLOWS: "dict[str, Flow[..., State[object]]]" = {}


def _pool_spec() -> ServeSpec:
    nightly = os.environ.get("ALIGNFLOW_NIGHTLY") or ("nightly.yaml" if Path("nightly.yaml").is_file() else None)
    return load_serve_spec(os.environ.get("ALIGNFLOW_EXPERIMENTS_DIR", "experiments"),
                           os.environ.get("ALIGNFLOW_HOSTS", "hosts.yaml"), nightly)


def __getattr__(name: str) -> "Flow[..., State[object]]":
    """Entry points of `prefect.yaml` (`flows/serve.py:alignment`, `flows/serve.py:nightly_regression`), built on
    first access in the deployment's working directory."""
    if name not in ("alignment", "nightly_regression"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _POOL_FLOWS:
        from flows.launch import build_alignment_flow
        from flows.nightly import build_nightly_flow

        spec = _pool_spec()
        _POOL_FLOWS["alignment"] = build_alignment_flow(spec.catalog, spec.hosts)
        _POOL_FLOWS["nightly_regression"] = build_nightly_flow(spec.catalog, spec.hosts, spec.nightly)
    return _POOL_FLOWS[name]
