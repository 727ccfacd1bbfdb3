"""`alignflow doctor [--hosts FILE] [--json]`: one table of everything a run needs, exit 1 listing every problem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        hosts: Path = typer.Option(Path("hosts.yaml"), "--hosts", help="The inventory whose hosts to check."),
        min_free_gib: float = typer.Option(2.0, "--min-free-gib", min=0, help="Free disk each workdir needs."),
        as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
    ) -> None:
        """Check this machine and every host of the inventory (python, rsync, setsid, flock, ssh, disk, Prefect,
        store); exit 1 listing every problem."""
        from concurrent.futures import ThreadPoolExecutor

        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from alignflow import doctor
        from alignflow.config.hosts import load_hosts
        from alignflow.state import database_url, state_dir
        from alignflow.transport import open_transport

        inventory = load_hosts(hosts)
        state = state_dir()
        min_free = int(min_free_gib * (1 << 30))
        checks = doctor.controller_checks(inventory, state=state, db_url=database_url(), environ=os.environ,
                                          min_free_bytes=min_free)
        with ThreadPoolExecutor(max_workers=min(8, len(inventory.hosts))) as pool:
            for found in pool.map(lambda h: doctor.host_checks(h, transport_factory=open_transport,
                                                               min_free_bytes=min_free), inventory.hosts.values()):
                checks += found
        problems = [c for c in checks if not c.ok]
        if as_json:
            typer.echo(json.dumps({"ok": not problems, "checks": [c.to_dict() for c in checks]}, indent=2))
            raise typer.Exit(1 if problems else 0)
        table = Table(title=f"alignflow doctor: this machine and the hosts of {hosts}", header_style="bold")
        for col in ("where", "check", "", "detail"):
            table.add_column(col, overflow="fold")
        for c in checks:
            table.add_row(c.where, c.what, "[green]ok[/]" if c.ok else "[bold red]PROBLEM[/]", escape(c.detail))
        console = Console()
        console.print(table)
        if problems:
            console.print(f"[bold red]{len(problems)} problem(s):[/]")
            for c in problems:
                console.print(f"  {escape(c.where)}: {escape(c.what)}: {escape(c.detail)}", highlight=False)
            raise typer.Exit(1)
        console.print("[green]ready[/]: `alignflow run experiments/demo.yaml`")
