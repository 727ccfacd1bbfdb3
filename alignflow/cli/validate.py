"""`alignflow validate [PATH...]`: check configuration files, print `PATH:LINE: message` for each problem (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from alignflow.errors import ConfigError

if TYPE_CHECKING:
    from alignflow.config import Inventory


def default_paths(root: Path) -> list[Path]:
    """The committed configuration: inventories, every experiment and the nightly settings."""
    paths = sorted(root.glob("hosts*.yaml"))
    paths += sorted((root / "experiments").glob("*.yaml"))
    paths += [p for p in (root / "nightly.yaml",) if p.is_file()]
    return paths


def check_serving_here(root: Path, hosts: Path) -> int:
    """What `alignflow serve --hosts HOSTS` checks in `root` (experiments/, nightly.yaml): experiments that the
    inventory cannot run are listed as not served, as serve lists them; returns the number of problems that would
    stop serve."""
    from alignflow.config.catalog import check_serving

    nightly = root / "nightly.yaml"
    try:
        checked = check_serving(root / "experiments", hosts, nightly if nightly.is_file() else None)
    except ConfigError as exc:
        for p in exc.problems:
            typer.echo(ConfigError.format_problem(p), err=True)
        return len(exc.problems)
    for u in checked.catalog.unserved:
        typer.echo(f"not served with {hosts}: {u.name}: " + "; ".join(u.reasons))
    typer.echo(f"serve offers: {', '.join(checked.catalog.names)}; nightly runs: "
               f"{', '.join(checked.nightly.experiments or checked.catalog.names)}")
    return 0


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate_cmd(
        paths: list[Path] = typer.Argument(None, help="Files to check; default: hosts*.yaml, experiments/*.yaml "
                                                      "and nightly.yaml."),
        hosts: Path | None = typer.Option(None, "--hosts", help="Inventory that experiments' host names must match; "
                                          "without PATHs, also check what `alignflow serve --hosts` checks."),
    ) -> None:
        """Validate hosts files, experiments, criteria files and nightly settings; exit 2 with PATH:LINE messages on
        any problem. With --hosts and no PATHs: what `serve` would offer (experiments the inventory cannot run are
        listed as not served, as serve lists them)."""
        if hosts is not None and not paths:
            root = Path(".")
            failed = _check_files([p for p in default_paths(root) if p.parent.name != "experiments"], None)
            raise typer.Exit(ConfigError.exit_code if failed + check_serving_here(root, hosts) else 0)
        targets = list(paths) if paths else default_paths(Path("."))
        if not targets:
            typer.echo("nothing to validate: no hosts*.yaml or experiments/*.yaml here", err=True)
            raise typer.Exit(2)
        inventory: Inventory | None = None
        if hosts is not None:
            from alignflow.config import load_hosts

            try:
                inventory = load_hosts(hosts)
            except ConfigError as exc:
                for p in exc.problems:
                    typer.echo(ConfigError.format_problem(p), err=True)
                raise typer.Exit(ConfigError.exit_code) from None
        raise typer.Exit(ConfigError.exit_code if _check_files(targets, inventory) else 0)


def _check_files(targets: list[Path], inventory: Inventory | None) -> int:
    """Validate each file, print `ok` or its problems; returns how many files failed."""
    from alignflow.config import validate_file

    failed = 0
    for path in targets:
        try:
            kind = validate_file(path, inventory)
        except ConfigError as exc:
            failed += 1
            for p in exc.problems:
                typer.echo(ConfigError.format_problem(p), err=True)
        else:
            typer.echo(f"ok  {path} ({kind})")
    return failed
