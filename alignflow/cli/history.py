"""`alignflow history [RUN] [--experiment X] [--limit N] [--json]`: runs newest first, or one run in detail."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from alignflow.store import RunRecord, Store


def _when(value: datetime | None) -> str:
    return "" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _console() -> Any:
    """A console for tables: the terminal's width, or wide enough not to cut ids and names when piped."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=240)


def _runs_table(runs: list[RunRecord]) -> Any:
    from rich.table import Table

    table = Table(title=None, show_lines=False, header_style="bold")
    for name in ("id", "experiment", "parent", "trigger", "status", "verdict", "started", "duration"):
        table.add_column(name, no_wrap=name in ("id", "parent", "started"))
    for r in runs:
        table.add_row(r.id, r.experiment, r.parent_id or "", r.trigger, r.status.value, r.verdict or "",
                      _when(r.started_at), _duration(r.duration_s))
    return table


def _show_run(store: Store, run_id: str, as_json: bool) -> None:
    from rich.table import Table

    run = store.get_run(run_id)
    steps = store.steps(run.id)
    artifacts = store.run_artifacts(run.id)
    comparison = store.comparison(run.id)
    if as_json:
        typer.echo(json.dumps({
            "run": run.to_json(),
            "steps": [s.to_json() for s in steps],
            "artifacts": [a.to_json() for a in artifacts],
            "snapshots": [s.to_json() for s in store.snapshots(run.id)],
            "comparison": None if comparison is None else comparison.to_json(),
        }, indent=2))
        return
    console = _console()
    console.print(_runs_table([run]))
    if run.error:
        console.print(f"[bold red]error:[/] {run.error}", highlight=False)
    if run.report:
        console.print(f"report: {run.report}", highlight=False)
    table = Table(title="steps", header_style="bold")
    for name in ("step", "status", "host", "exit", "duration", "step run", "reused from"):
        table.add_column(name, no_wrap=name in ("step run", "reused from"))
    for s in steps:
        table.add_row(s.step, s.status.value, s.host or "", "" if s.exit_code is None else str(s.exit_code),
                      _duration(s.duration_s), s.id, s.reused_from or "")
    console.print(table)
    if artifacts:
        by_step = {s.id: s.step for s in steps}
        table = Table(title="artifacts", header_style="bold")
        for name in ("step", "name", "host", "sha256", "size", "path"):
            table.add_column(name, no_wrap=name == "sha256")
        for a in artifacts:
            table.add_row(by_step.get(a.step_run_id, a.step_run_id), a.name, a.host, a.sha256[:16],
                          _size(a.size_bytes), a.path)
        console.print(table)
    if comparison is not None:
        console.print(f"comparison: verdict [bold]{comparison.verdict}[/], {len(comparison.criteria)} criteria",
                      highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("history")
    def history_cmd(
        run_id: str | None = typer.Argument(None, help="Show this run (id or unique prefix): steps, artifacts."),
        experiment: str | None = typer.Option(None, "--experiment", "-e", help="Only runs of this experiment."),
        limit: int = typer.Option(50, "--limit", "-n", min=1, help="At most this many runs."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """Runs recorded in the store, newest first; with a RUN id, that run's steps, artifacts and comparison."""
        from alignflow.state import database_url
        from alignflow.store import Store, database

        url = database_url()
        missing = database.missing_sqlite_file(url)
        if missing is not None:  # a read-only command does not create a store as a side effect
            if run_id is not None:
                typer.echo(f"no store at {missing}; nothing has been recorded yet", err=True)
                raise typer.Exit(1)
            typer.echo("[]" if as_json else f"no runs recorded: no store at {missing} yet")
            return
        with Store.open(url) as store:
            if run_id is not None:
                _show_run(store, run_id, as_json)
                return
            runs = store.list_runs(experiment=experiment, limit=limit)
            if as_json:
                typer.echo(json.dumps([r.to_json() for r in runs], indent=2))
            elif not runs:
                typer.echo(f"no runs recorded in {store.url}" + (f" for {experiment}" if experiment else ""))
            else:
                _console().print(_runs_table(runs))
