"""`alignflow validate [PATH...]`: check configuration files, print `PATH:LINE: message` for each problem."""

from __future__ import annotations

from pathlib import Path

import typer

from alignflow.config import Inventory, load_hosts, validate_file
from alignflow.errors import ConfigError


def default_paths(root: Path) -> list[Path]:
    """The committed configuration: inventories and every experiment."""
    paths = sorted(root.glob("hosts*.yaml"))
    paths += sorted((root / "experiments").glob("*.yaml"))
    return paths


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate_cmd(
        paths: list[Path] = typer.Argument(None, help="Files to check; default: hosts*.yaml and experiments/*.yaml."),
        hosts: Path | None = typer.Option(None, "--hosts", help="Inventory that experiments' host names must match."),
    ) -> None:
        """Validate hosts files, experiments and criteria files; exit 1 with PATH:LINE messages on any problem."""
        targets = list(paths) if paths else default_paths(Path("."))
        if not targets:
            typer.echo("nothing to validate: no hosts*.yaml or experiments/*.yaml here", err=True)
            raise typer.Exit(1)
        inventory: Inventory | None = None
        failed = 0
        if hosts is not None:
            try:
                inventory = load_hosts(hosts)
            except ConfigError as exc:
                for p in exc.problems:
                    typer.echo(ConfigError.format_problem(p), err=True)
                raise typer.Exit(1) from None
        for path in targets:
            try:
                kind = validate_file(path, inventory)
            except ConfigError as exc:
                failed += 1
                for p in exc.problems:
                    typer.echo(ConfigError.format_problem(p), err=True)
            else:
                typer.echo(f"ok  {path} ({kind})")
        raise typer.Exit(1 if failed else 0)
