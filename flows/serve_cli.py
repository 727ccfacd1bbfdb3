"""`alignflow serve`: the UI's launch form and the nightly as deployments, and the reports over http (flows/serve.py).

Everything is checked before anything is registered: the inventory, every experiment file offered in the UI, the
nightly settings (experiments, cron, time zone), the Prefect server and the alignflow store - a team server that
starts with a broken piece would only fail at 2 a.m.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from alignflow.errors import ConfigError

if TYPE_CHECKING:
    from flows.serve import DeploymentView, ServeSpec


def _api_url() -> tuple[str, str]:
    """The configured Prefect API, else the kept server alignflow owns (`alignflow server start`); with its UI."""
    import os

    from alignflow.state import state_dir
    from flows.prefect_client import configured_api_url, ui_url
    from flows.server import kept_server, ui_base

    url = configured_api_url()
    if url:
        return url, ui_url() or ui_base(url)
    kept = kept_server(state_dir())
    if kept is None:
        raise ConfigError("PREFECT_API_URL is not set and no Prefect server is kept: `alignflow serve` registers "
                          "deployments with a lasting Prefect server; start one with `alignflow server start` (or "
                          "use a team server, docker/compose.yaml, and export PREFECT_API_URL=http://HOST:4200/api)")
    # serve's flow-run subprocesses must reach it too, and the links they log (`View at`) open its UI
    os.environ.update(PREFECT_API_URL=kept.url, PREFECT_UI_URL=kept.ui)
    return kept.url, kept.ui


def _check_server(api_url: str) -> None:
    import httpx

    try:
        ok = httpx.get(f"{api_url.rstrip('/')}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ConfigError(f"{api_url}: Prefect server not reachable ({exc}); is it running?") from None
    if ok is not True:
        raise ConfigError(f"{api_url}/health answered {ok!r}, not true")


def serve_cmd(
    experiments: Path = typer.Option(Path("experiments"), "--experiments",
                                     help="Directory whose *.yaml experiments the UI offers."),
    hosts: Path = typer.Option(Path("hosts.yaml"), "--hosts", help="Host inventory every run uses."),
    nightly: Path | None = typer.Option(None, "--nightly",
                                        help="Nightly settings (experiments, cron, timezone, drift); "
                                             "default: nightly.yaml when present."),
    cron: str | None = typer.Option(None, "--cron", help="Nightly schedule (default '0 2 * * *')."),
    timezone: str | None = typer.Option(None, "--timezone", help="Time zone of the schedule (default UTC)."),
    nightly_experiment: list[str] = typer.Option([], "--nightly-experiment",
                                                 help="Experiment of the nightly (repeatable; default: all)."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Most flow runs executing at once."),
    reports_bind: str = typer.Option("127.0.0.1", "--reports-bind",
                                     help="Address the read-only reports server listens on (0.0.0.0: all)."),
    reports_port: int | None = typer.Option(None, "--reports-port", min=0, max=65535,
                                            help="Port of the reports server (0: any free port; default 4201, "
                                                 "or a free port when 4201 is taken)."),
    reports_url: str | None = typer.Option(None, "--reports-url",
                                           help="Address people open the reports at (default: "
                                                "http://BIND:PORT); ignored when ALIGNFLOW_REPORTS_URL is set."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Build and print the deployments, then exit."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: print the deployments as JSON."),
) -> None:
    """Serve the `alignment/launch` (UI form) and `nightly-regression/nightly` (cron) deployments until SIGTERM,
    and the state dir's HTML reports read-only over http.

    Exit 0 after --dry-run, 1 when serving fails, 2 on a usage or configuration error; stopped by a signal: 128 + the
    signal.
    """
    from flows.prefect_client import use_state_dir_for_prefect

    use_state_dir_for_prefect()
    from flows.serve import describe, load_serve_spec

    if nightly is None and Path("nightly.yaml").is_file():
        nightly = Path("nightly.yaml")
    spec = load_serve_spec(experiments, hosts, nightly, cron=cron, timezone=timezone,
                           nightly_experiments=list(nightly_experiment) or None)
    described = describe(spec)
    if dry_run and as_json:
        typer.echo(json.dumps([d.model_dump(mode="json") for d in described], indent=2))
        raise typer.Exit(0)
    console = Console()
    _print_spec(console, spec, described)
    if dry_run:
        raise typer.Exit(0)
    from alignflow.once import unless_held
    from alignflow.state import state_dir

    with unless_held(state_dir() / "serve.lock", what="alignflow serve") as other:
        if other is not None:  # two serves of one state dir would register the same deployments twice (issue 49)
            console.print(f"already serving: `alignflow serve` of state dir {state_dir()} is running ({other}); "
                          "its deployments take the launches and the nightly. Stop it first (Ctrl-C or SIGTERM) "
                          "to serve other settings.", highlight=False, soft_wrap=True)
            raise typer.Exit(0)
        _serve(console, spec, reports_bind=reports_bind, reports_port=reports_port, reports_url=reports_url,
               limit=limit)


def _serve(console: Console, spec: ServeSpec, *, reports_bind: str, reports_port: int | None,
           reports_url: str | None, limit: int | None) -> None:
    """Check the Prefect server and the store, then serve until told to stop (the caller holds serve.lock)."""
    from flows.serve import serve_deployments, serving_reports

    api, ui = _api_url()
    _check_server(api)
    from alignflow.cli.runs import open_store
    from alignflow.state import state_dir

    store = open_store()  # fails now, with the database named, if the store is unreachable or too new
    try:
        console.print(f"store:       {store.url}", highlight=False, soft_wrap=True)
    finally:
        store.close()
    console.print(f"prefect:     {api} — UI {ui}/deployments", highlight=False, soft_wrap=True)
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api, PREFECT_UI_URL: ui}), \
            serving_reports(state_dir(), bind=reports_bind, port=reports_port, public_url=reports_url) as url:
        console.print(f"reports:     {url}/", highlight=False, soft_wrap=True)
        serve_deployments(spec, limit=limit)
    console.print("stopped (schedules left active)")


def _print_spec(console: Console, spec: ServeSpec, described: list[DeploymentView]) -> None:
    """What `serve` registers: each deployment with its schedule and parameters; the experiments offered (and
    those that are not, with why), the nightly's and its alert."""
    table = Table(show_header=True, header_style="bold")
    for col in ("deployment", "schedule", "parameters"):
        table.add_column(col)
    for d in described:
        when = ", ".join(f"{s.cron} ({s.timezone})" for s in d.schedules) or "on demand"
        table.add_row(d.name, when, ", ".join(d.parameters))
    console.print(table)
    console.print(f"experiments: {', '.join(spec.catalog.names)} ({spec.catalog.directory})", highlight=False)
    for u in spec.catalog.unserved:
        console.print(f"not served:  {escape(u.name)}: {escape('; '.join(u.reasons))}", highlight=False)
    console.print(f"nightly:     {', '.join(spec.nightly.experiments or spec.catalog.names)}", highlight=False)
    if spec.nightly.alert is not None:
        console.print(f"alert:       {spec.nightly.alert.format} webhook on a failed nightly", highlight=False)


def register_serve(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
