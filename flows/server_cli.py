"""`alignflow server start|stop|status`: the Prefect server alignflow keeps for later runs (flows/server.py)."""

from __future__ import annotations

import json
from typing import Any

import typer


def server_app() -> typer.Typer:
    app = typer.Typer(help="The Prefect server alignflow runs for you when PREFECT_API_URL is not set.",
                             no_args_is_help=True)

    @app.command("start")
    def start_cmd(
        timeout_s: float | None = typer.Option(None, "--timeout", min=1, help="Seconds to wait for it to answer "
                                               "(default $ALIGNFLOW_PREFECT_START_TIMEOUT_S or 300)."),
    ) -> None:
        """Start a Prefect server under the state dir and keep it: later runs reuse it (no start-up cost).

        Exit 0 when the server answers, 1 when it does not start.
        """
        from alignflow.state import state_dir
        from flows import server
        from flows.prefect_client import use_state_dir_for_prefect

        use_state_dir_for_prefect()
        record, started = server.start_kept(state_dir(), timeout_s=timeout_s, events=typer.echo)
        verb = "started" if started else "already running"
        typer.echo(f"prefect server {verb}: {record.url}, pid {record.identity.pid}, log {record.log}")
        typer.echo(f"UI {record.ui}/runs")
        _warn_if_ui_elsewhere(record)
        typer.echo("runs without PREFECT_API_URL use it; `alignflow ui RUN` opens a run's page; `alignflow server "
                   "stop` ends it")

    @app.command("stop")
    def stop_cmd() -> None:
        """Stop the kept Prefect server.

        Exit 0 stopped (or none was running), 1 when it cannot be stopped.
        """
        from alignflow.state import state_dir
        from flows import server

        record = server.stop_kept(state_dir())
        typer.echo("no kept prefect server" if record is None else f"stopped the prefect server at {record.url}")

    @app.command("status")
    def status_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """The kept server (and servers of runs in progress): url, pid, whether it answers. Exit 1 if none is up."""
        from alignflow.state import state_dir
        from flows import server

        state = state_dir()
        server.sweep(state)
        found = [r for r in [server.kept_server(state)] if r is not None]
        found += [r for _, r in server.run_servers(state) if r.alive()]
        rows = [{"url": r.url, "ui": f"{r.ui}/runs", "pid": r.identity.pid, "mode": "kept" if r.kept else "per-run",
                 "healthy": server.healthy(r.url), "ui_api_url": server.ui_api_url(r.url), "log": r.log,
                 "owner_pid": None if r.owner is None else r.owner.get("pid")} for r in found]
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
        elif not rows:
            typer.echo(f"no prefect server of alignflow's is running (state dir {state}); `alignflow server start` "
                       "keeps one")
        for row in [] if as_json else rows:
            owner = f", for the run of pid {row['owner_pid']}" if row["owner_pid"] else ""
            health = "healthy" if row["healthy"] else "NOT answering"
            typer.echo(f"{row['mode']} prefect server {row['url']}: pid {row['pid']}{owner}, {health}; log "
                       f"{row['log']}\n  UI {row['ui']}")
        for record in [] if as_json else found:
            _warn_if_ui_elsewhere(record)
        raise typer.Exit(0 if any(r["healthy"] for r in rows) else 1)

    return app


def _warn_if_ui_elsewhere(record: Any) -> None:
    """A server whose UI calls another API (started by an alignflow before the UI was told its own) is restarted."""
    from flows import server

    called = server.ui_api_url(record.url)
    if called is not None and called.rstrip("/") != record.url.rstrip("/"):
        typer.echo(f"warning: this server's UI calls {called}, not its own API: restart it (`alignflow server stop`, "
                   "`alignflow server start`)", err=True)


def register_ui(app: typer.Typer) -> None:
    """`alignflow ui [RUN]`: the Prefect UI's page of a run (or its runs list)."""

    @app.command("ui")
    def ui_cmd(
        run_id: str | None = typer.Argument(None, help="A run id (or a unique prefix); default: the runs list."),
        open_browser: bool = typer.Option(True, "--open/--no-open", help="Open it in a browser when this machine "
                                          "has one (a graphical session, or $BROWSER); the URL is printed always."),
        timeout_s: float | None = typer.Option(None, "--timeout", min=1, help="Seconds to wait for a Prefect server "
                                               "this command starts (default $ALIGNFLOW_PREFECT_START_TIMEOUT_S or "
                                               "300)."),
    ) -> None:
        """Print (and open) the Prefect UI's page of RUN: the configured PREFECT_API_URL's UI, else the server
        alignflow keeps (started now if none is running; `alignflow server stop` ends it). Exit 2 when RUN is
        unknown or the server has no flow run of it."""
        from alignflow.errors import ConfigError
        from alignflow.state import state_dir
        from flows.prefect_client import use_state_dir_for_prefect

        use_state_dir_for_prefect()
        from flows.prefect_client import find_flow_run, run_link, ui_server

        full_id = None
        if run_id is not None:
            from alignflow.cli.runs import open_store

            with open_store(existing=True) as store:
                full_id = store.get_run(run_id).id
        found = ui_server(state_dir(), timeout_s=timeout_s)
        if found.source == "started":
            typer.echo(f"started a Prefect server for the UI: {found.api_url}; later runs use it, `alignflow server "
                       "stop` ends it", err=True)
        if full_id is None:
            url = f"{found.ui}/runs"
        else:
            flow_run = find_flow_run(found.api_url, full_id)
            if flow_run is None:
                raise ConfigError(f"run {full_id}: the Prefect server at {found.api_url} has no flow run of it (a run "
                                  "made without Prefect, such as `alignflow diagnose`, or against another server); "
                                  f"`alignflow show {full_id}` prints it")
            url = str(run_link(flow_run.id, found.ui))
        typer.echo(url)
        if open_browser and _has_browser():
            import webbrowser

            webbrowser.open(url)


def _has_browser() -> bool:
    """Whether a browser can open here without taking the terminal over: one named in $BROWSER, a graphical
    session (X11, Wayland) or macOS."""
    import os
    import sys

    return bool(os.environ.get("BROWSER") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                or sys.platform == "darwin")
