"""`alignflow server start|stop|status`: the Prefect server alignflow keeps for later runs (flows/server.py)."""

from __future__ import annotations

import json

import typer


def server_app() -> typer.Typer:
    app = typer.Typer(help="The Prefect server alignflow runs for you when PREFECT_API_URL is not set.",
                             no_args_is_help=True)

    @app.command("start")
    def start_cmd(
        timeout_s: float | None = typer.Option(None, "--timeout", min=1, help="Seconds to wait for it to answer "
                                               "(default $ALIGNFLOW_PREFECT_START_TIMEOUT_S or 300)."),
    ) -> None:
        """Start a Prefect server under the state dir and keep it: later runs reuse it (no start-up cost)."""
        from alignflow.state import state_dir
        from flows import server

        record, started = server.start_kept(state_dir(), timeout_s=timeout_s)
        verb = "started" if started else "already running"
        typer.echo(f"prefect server {verb}: {record.url} (UI {record.ui}), pid {record.identity.pid}, log {record.log}")
        typer.echo("runs without PREFECT_API_URL use it; `alignflow server stop` ends it")

    @app.command("stop")
    def stop_cmd() -> None:
        """Stop the kept Prefect server."""
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
        rows = [{"url": r.url, "ui": r.ui, "pid": r.identity.pid, "mode": "kept" if r.kept else "per-run",
                 "healthy": server.healthy(r.url), "log": r.log,
                 "owner_pid": None if r.owner is None else r.owner.get("pid")} for r in found]
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
        elif not rows:
            typer.echo(f"no prefect server of alignflow's is running (state dir {state}); `alignflow server start` "
                       "keeps one")
        for row in [] if as_json else rows:
            owner = f", for the run of pid {row['owner_pid']}" if row["owner_pid"] else ""
            health = "healthy" if row["healthy"] else "NOT answering"
            typer.echo(f"{row['mode']} prefect server {row['url']} (UI {row['ui']}): pid {row['pid']}{owner}, "
                       f"{health}; log {row['log']}")
        raise typer.Exit(0 if any(r["healthy"] for r in rows) else 1)

    return app
