"""`alignflow preflight EXPERIMENT [--hosts FILE] [--json] [--all]`: compare both sides' configurations.

Exit status 0 when every alignment-critical setting agrees, 1 when any differs, 2 when a file cannot be read or
is invalid (a configuration error).
Nothing is run and no host is contacted: the MindFormers template is read on this machine and both training
commands are rendered exactly as `alignflow run` would launch them.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def register(app: typer.Typer) -> None:
    @app.command("preflight")
    def preflight_cmd(
        experiment: str = typer.Argument(..., help="Experiment file, or a name under experiments/."),
        hosts: Path | None = typer.Option(None, "--hosts", help="Inventory: checks host names and adds each "
                                          "training host's env (HCCL/NVTE determinism) to the comparison."),
        check_hosts: bool = typer.Option(False, "--check-hosts", help="With --hosts: probe the host of each "
                                         "Megatron side for Megatron-LM at its entry (version, torch or torch_npu "
                                         "and MindSpeed, declared extensions), as a run does."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        show_all: bool = typer.Option(False, "--all", help="List every checked setting, not only mismatches."),
    ) -> None:
        """Compare the NPU and GPU sides' alignment-critical settings, whatever their backends; exit 1 on any
        mismatch."""
        from alignflow.cli.show import resolve_experiment
        from alignflow.config import load_experiment, load_hosts
        from alignflow.preflight import check_experiment

        path = resolve_experiment(experiment)
        inventory = load_hosts(hosts) if hosts is not None else None
        exp = load_experiment(path, inventory)
        factory = None
        if check_hosts:
            from alignflow.errors import ConfigError
            from alignflow.transport import open_transport

            if inventory is None:
                raise ConfigError("preflight: --check-hosts needs --hosts FILE")
            factory = open_transport
        report = check_experiment(exp, inventory=inventory, transport_factory=factory)
        if as_json:
            typer.echo(json.dumps({"experiment": exp.name, "path": str(path), **report.to_dict()}, indent=2))
            raise typer.Exit(0 if report.ok else 1)
        console = Console()
        console.print(f"preflight of [bold]{escape(exp.name)}[/] ({escape(str(path))})", highlight=False)
        console.print(f"  NPU: {escape(report.sources['npu'])}\n  GPU: {escape(report.sources['gpu'])}",
                      highlight=False)
        if show_all:
            table = Table(show_header=True, header_style="bold", show_lines=True)
            for col in ("setting", "NPU (source)", "GPU (source)", "status"):
                table.add_column(col, overflow="fold")
            for f in report.findings:
                status = ("[green]ok[/]" if f.status == "ok" else "[yellow]not checked[/]" if f.status == "unchecked"
                          else "[bold red]" + escape("; ".join(f.problems)) + "[/]")
                table.add_row(escape(f.label), escape(f.npu.show()) if f.npu else "-",
                              escape(f.gpu.show()) if f.gpu else "-", status)
            console.print(table)
        for f in report.mismatches:  # one line each, never wrapped: greppable, and both values side by side
            console.print(f"[bold red]x[/] {escape(f.line())}", soft_wrap=True, highlight=False)
        color = "green" if report.ok else "red"
        console.print(f"[bold {color}]{escape(report.summary().splitlines()[0].rstrip(':'))}[/]", highlight=False)
        raise typer.Exit(0 if report.ok else 1)
