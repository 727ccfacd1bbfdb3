"""`alignflow serve` — register the alignment and nightly deployments with a Prefect server and run their flow runs.

Like `run`, this command reaches up into `flows/` (the CLI is the application's outermost layer). Everything is
checked before anything is registered: the inventory, every experiment file offered in the UI, the nightly
settings (experiments, cron, time zone), the Prefect server and the alignflow store — a team server that starts
with a broken piece would only fail at 2 a.m.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from alignflow.errors import ConfigError


def _api_url() -> str:
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise ConfigError("PREFECT_API_URL is not set: `alignflow serve` registers deployments with a Prefect "
                          "server; start one (`prefect server start`, or docker/compose.yaml) and export "
                          "PREFECT_API_URL=http://HOST:4200/api")
    return str(url)


def _check_server(api_url: str) -> None:
    import httpx

    try:
        ok = httpx.get(f"{api_url.rstrip('/')}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ConfigError(f"{api_url}: Prefect server not reachable ({exc}); is it running?") from None
    if ok is not True:
        raise ConfigError(f"{api_url}/health answered {ok!r}, not true")


def register(app: typer.Typer) -> None:
    @app.command("serve")
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
        dry_run: bool = typer.Option(False, "--dry-run", help="Build and print the deployments, then exit."),
        as_json: bool = typer.Option(False, "--json", help="With --dry-run: print the deployments as JSON."),
    ) -> None:
        """Serve the `alignment/launch` (UI form) and `nightly-regression/nightly` (cron) deployments until SIGTERM."""
        from flows.serve import describe, load_serve_spec, serve_deployments

        if nightly is None and Path("nightly.yaml").is_file():
            nightly = Path("nightly.yaml")
        spec = load_serve_spec(experiments, hosts, nightly, cron=cron, timezone=timezone,
                               nightly_experiments=list(nightly_experiment) or None)
        described = describe(spec)
        if dry_run and as_json:
            typer.echo(json.dumps(described, indent=2))
            raise typer.Exit(0)
        console = Console()
        table = Table(show_header=True, header_style="bold")
        for col in ("deployment", "schedule", "parameters"):
            table.add_column(col)
        for d in described:
            when = ", ".join(f"{s['cron']} ({s['timezone']})" for s in d["schedules"]) or "on demand"
            table.add_row(d["name"], when, ", ".join(d["parameters"]))
        console.print(table)
        console.print(f"experiments: {', '.join(spec.catalog.names)} ({spec.catalog.directory})", highlight=False)
        console.print(f"nightly:     {', '.join(spec.nightly.experiments or spec.catalog.names)}", highlight=False)
        if dry_run:
            raise typer.Exit(0)
        api = _api_url()
        _check_server(api)
        from tasks.context import open_store

        store = open_store()  # fails now, with the database named, if the store is unreachable or too new
        try:
            console.print(f"store:       {store.url}", highlight=False)
        finally:
            store.close()
        console.print(f"prefect:     {api} — UI {api.rstrip('/').removesuffix('/api')}/v2/deployments", highlight=False)
        serve_deployments(spec, limit=limit)
        console.print("stopped (schedules left active)")
