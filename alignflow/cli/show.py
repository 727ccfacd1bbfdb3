"""`alignflow show RUN` and what the run commands share: finding an experiment file, printing a run record.

`run`, `rerun`, `reproduce` and `serve` drive the orchestrator, so they live with the flows (`flows/cli.py`) and
join this command line through the `alignflow.commands` entry point group: the core never imports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from alignflow.errors import ConfigError

_STATUS_STYLE = {"ran": "green", "cached": "cyan", "failed": "bold red", "skipped": "dim", "running": "yellow"}


def resolve_experiment(name_or_path: str) -> Path:
    """A path as given, else `experiments/<name>.yaml`."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"{path}: file not found")
        return path
    candidate = Path("experiments") / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in Path("experiments").glob("*.yaml"))
    raise ConfigError(f"unknown experiment '{name_or_path}'; experiments/ has: {', '.join(known) or 'nothing'}")


def print_record(record: dict[str, Any], *, seconds: float | None = None) -> None:
    console = Console()
    console.print(f"run [bold]{record['run_id']}[/] of {record['experiment']}"
                  + (f" (parent {record['parent']})" if record.get("parent") else ""))
    table = Table(show_header=True, header_style="bold")
    for col in ("step", "host", "status", "outputs"):
        table.add_column(col)
    for s in record["steps"]:
        outs = ", ".join(f"{a['name']} {a['sha256'][:12]}" for a in s["artifacts"])
        style = _STATUS_STYLE.get(s["status"], "")
        table.add_row(s["step"], s["host"] or "", f"[{style}]{s['status']}[/]" if style else s["status"], outs)
    console.print(table)
    if record.get("error"):
        console.print(f"[bold red]error:[/] {record['error']}", highlight=False)
    verdict = record.get("verdict") or "none"
    color = "green" if verdict == "pass" else "red"
    console.print(f"verdict: [bold {color}]{verdict.upper()}[/]")
    if record.get("report"):
        console.print(f"report:  {record['report']}", highlight=False)
    if seconds is not None:
        console.print(f"time:    {seconds:.1f} s")


def register(app: typer.Typer) -> None:
    @app.command("show")
    def show_cmd(
        run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Show a run: steps, hosts, statuses, artifacts with sha256, verdict, report."""
        from alignflow.runner.run import show
        from alignflow.runner.session import default_state_dir
        from alignflow.store import Store

        store = Store.open(state_dir=default_state_dir(), upgrade=True)
        try:
            record = show(store, store.get_run(run_id).id)
        finally:
            store.close()
        if as_json:
            typer.echo(json.dumps(record, indent=2))
        else:
            print_record(record)
