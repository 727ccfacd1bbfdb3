"""`alignflow gc [DIR...] [--hosts FILE] [--delete] [--min-age-hours H] [--json]`: what no run references, on every
host; or, given directories of this machine, what killed writers (a conversion, an export) left in them.

A dry run by default: it lists what it would delete, with sizes, and deletes nothing. `--delete` deletes it.
The rules (what counts as referenced, what is never touched) are in `alignflow.gc` and `alignflow.staging`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from alignflow.config.hosts import Host
    from alignflow.gc import Garbage, Survey
    from alignflow.transport import Transport

EXIT_BAD_INPUT = 2


def _age(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.1f}h" if hours < 48 else f"{hours / 24:.1f}d"


def register(app: typer.Typer) -> None:
    @app.command("gc")
    def gc_cmd(
        directories: list[Path] | None = typer.Argument(
            None, help="Directories of this machine to search instead of the hosts: the staging directories that "
                       "killed writers (conversions, exports) left beside their destinations there.",
            exists=True, file_okay=False),
        hosts: Path = typer.Option(Path("hosts.yaml"), "--hosts", help="Host inventory whose workdirs are searched."),
        do_delete: bool = typer.Option(False, "--delete", help="Delete what is listed (default: only list it)."),
        min_age_hours: float = typer.Option(1.0, "--min-age-hours", min=0.0,
                                            help="Keep anything modified more recently than this."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """Artifacts, staged inputs, job dirs and staging leftovers on the hosts that no run's record references.

        Exit 0 listed (or removed), 1 when a host cannot be reached, 2 on a usage or configuration error.
        """
        from alignflow.gc import Survey, delete, delete_local, find_garbage, local_staging

        if directories:
            found = Survey(tuple(local_staging(directories)), ())
            _print(found, delete_local(found.garbage) if do_delete else None, as_json)
            return
        from alignflow.config import load_hosts
        from alignflow.state import database_url
        from alignflow.store import Store, database
        from alignflow.transport import open_transport

        url = database_url()
        missing = database.missing_sqlite_file(url)
        if missing is not None:
            typer.echo(f"error: no store at {missing}: gc must know every run's records before it calls anything "
                       "garbage (set ALIGNFLOW_STATE_DIR or ALIGNFLOW_DB_URL to the store the runs use)", err=True)
            raise typer.Exit(EXIT_BAD_INPUT)
        inventory = load_hosts(hosts)
        opened: dict[str, Transport] = {}

        def transport(host: Host) -> Transport:
            if host.name not in opened:
                opened[host.name] = open_transport(host)
            return opened[host.name]

        try:
            with Store.open(url) as store:
                survey = find_garbage(inventory, store.host_references(), transport=transport,
                                      min_age_s=min_age_hours * 3600)
                deleted = None
                if do_delete and survey.garbage:
                    if store.run_count() == 0:
                        typer.echo(f"error: {store.url} records no run, so it references nothing; refusing to "
                                   "delete (is this the store your runs use?)", err=True)
                        raise typer.Exit(EXIT_BAD_INPUT)
                    deleted = delete(survey, store.host_references(), transport=transport, inventory=inventory)
        finally:
            for t in opened.values():
                t.close()
        _print(survey, deleted, as_json)


def _print(survey: Survey, deleted: list[Garbage] | None, as_json: bool) -> None:
    from alignflow.cli.history import _console
    from alignflow.compare.formatting import fmt_size as _size

    if as_json:
        typer.echo(json.dumps({
            "garbage": [g.to_json() for g in survey.garbage], "size_bytes": survey.size_bytes,
            "deleted": None if deleted is None else [g.to_json() for g in deleted],
            "unreachable": [{"host": h, "error": e} for h, e in survey.unreachable],
        }, indent=2))
        return
    for host, error in survey.unreachable:
        typer.echo(f"warning: {host}: not searched: {error}", err=True)
    if not survey.garbage:
        typer.echo("nothing to collect: every artifact on the hosts is referenced by a run's record, and no staging "
                   "directory of a dead writer was found")
        return
    from rich.table import Table

    table = Table(header_style="bold")
    for name in ("host", "kind", "size", "age", "path", "why"):
        table.add_column(name, no_wrap=name not in ("path", "why"))
    for g in survey.garbage:
        table.add_row(g.host, g.kind, _size(g.size_bytes), _age(g.age_s), g.path, g.why)
    console = _console()
    if not console.is_terminal:  # piped: whole paths on one line each, for whoever reads them next
        from rich.console import Console

        console = Console(width=max(console.width, max(len(g.path) + len(g.why) for g in survey.garbage) + 40))
    console.print(table)
    if deleted is None:
        typer.echo(f"would free {_size(survey.size_bytes)} ({len(survey.garbage)} items); nothing was deleted - "
                   "run again with --delete to delete them")
    else:
        typer.echo(f"deleted {len(deleted)} items ({_size(sum(g.size_bytes for g in deleted))})")
