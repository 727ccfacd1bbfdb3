"""`alignflow history [RUN] [--experiment X] [--limit N] [--json] [--reconcile]`: runs newest first, or one run in
detail."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import typer

from alignflow.compare.formatting import fmt_duration

if TYPE_CHECKING:
    from alignflow.store import RunRecord, Store


def _when(value: datetime | None, wide: bool = True) -> str:
    return "" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S" if wide else "%m-%d %H:%M")


def _console() -> Any:
    from alignflow.cli.show import console

    return console()


WIDE = 120  # a terminal at least this wide shows every column of `history`


def _runs_table(runs: list[RunRecord], width: int = WIDE) -> Any:
    """The runs, one a row; below `WIDE` columns without config, parent and trigger (`show RUN` has them, and the
    note under the table says so), the verdict beside the status and the start as month-day and time, so that no
    id, name or date is split (issue 47: `demo-sam/e-format` at 80 columns)."""
    from rich.table import Table

    from alignflow.cli import fit

    wide = width >= WIDE
    columns = ["id", "experiment", "config", "parent", "trigger", "status", "verdict", "started", "duration"]
    shown = columns if wide else ["id", "experiment", "status, verdict", "started", "duration"]
    rows = []
    for r in runs:
        cells = dict(zip(columns, [r.id, r.experiment, r.config_sha256[:8], r.parent_id or "", r.trigger,
                                   r.status.value, r.verdict or "", _when(r.started_at, wide),
                                   fmt_duration(r.duration_s)], strict=True))
        cells["status, verdict"] = cells["status"] + (f", {cells['verdict'].upper()}" if cells["verdict"] else "")
        rows.append([cells[c] for c in shown])
    table = Table(title=None, show_lines=False, header_style="bold")
    fit.add_columns(table, shown, rows, [c == "duration" for c in shown], width)
    for row in rows:
        table.add_row(*row)
    return table


def config_notes(runs: list[RunRecord]) -> list[str]:
    """One line per experiment whose listed runs ran under several configurations (config fingerprints): each
    with the files it was read from and its number of runs. A copy of an experiment file that keeps its `name:`
    joins that experiment's history; its runs are flagged here, never silently mixed (issue 40)."""
    configs: dict[str, dict[str, tuple[set[str], int]]] = {}
    for r in runs:
        files, count = configs.setdefault(r.experiment, {}).get(r.config_sha256, (set(), 0))
        path = r.experiment_file
        configs[r.experiment][r.config_sha256] = (files | ({str(path)} if path else set()), count + 1)
    lines = []
    for experiment, by_sha in configs.items():
        if len(by_sha) < 2:
            continue
        shown = "; ".join(f"{sha[:8]} from {', '.join(sorted(files)) or 'an unrecorded file'} ({count} run(s))"
                          for sha, (files, count) in by_sha.items())
        lines.append(f"note: {experiment} ran under {len(by_sha)} configurations here: {shown} - runs of different "
                     "configurations are not comparable (the nightly compares a run with a passing run of its own "
                     "configuration)")
    return lines


def _left_jobs(store: Store, runs: list[RunRecord]) -> list[str]:
    """`run: job` lines for the jobs interrupted runs left behind (they may still be running on their hosts)."""
    from alignflow.store import RunStatus

    lines = []
    for r in runs:
        if r.status == RunStatus.INTERRUPTED:
            lines += [f"{r.id}: {j.describe()}" for j in store.run_jobs(r.id) if j.interrupted]
    return lines


def run_summary(r: RunRecord) -> dict[str, Any]:
    """One run of `history --json`: the run view's keys (alignflow.runview), without steps and criteria."""
    from alignflow.runview import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION, "run_id": r.id, "experiment": r.experiment, "status": r.status.value,
            "verdict": r.verdict, "trigger": r.trigger, "parent_id": r.parent_id, "code_version": r.code_version,
            "started": r.started_at.isoformat(), "finished": r.finished_at.isoformat() if r.finished_at else None,
            "duration_s": r.duration_s, "error": r.error, "report": r.report, "config_sha256": r.config_sha256,
            "experiment_file": r.experiment_file}


def register(app: typer.Typer) -> None:
    @app.command("history")
    def history_cmd(
        run_id: str | None = typer.Argument(None, help="Show this run (id or unique prefix): the same as "
                                            "`alignflow show RUN`."),
        experiment: str | None = typer.Option(None, "--experiment", "-e", help="Only runs of this experiment."),
        limit: int = typer.Option(50, "--limit", "-n", min=1, help="At most this many runs."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        reconcile: bool = typer.Option(False, "--reconcile", help="Also say which running runs cannot be checked "
                                       "from here (their controller is on another machine, or was not recorded)."),
    ) -> None:
        """Runs recorded in the store, newest first; `history RUN` is `show RUN`. Runs whose controller died are
        marked interrupted first, and listed with the jobs they left.

        Exit 0, 2 when RUN is unknown.
        """
        from alignflow.cli import runs as cli_runs
        from alignflow.state import database_url, state_dir
        from alignflow.store import database

        if run_id is not None:
            from alignflow.cli.show import show_run

            show_run(run_id, as_json=as_json)
            return
        url = database_url()
        missing = database.missing_sqlite_file(url)
        if missing is not None:  # a read-only command does not create a store as a side effect
            typer.echo("[]" if as_json else f"no runs recorded: no store at {missing} yet")
            return
        with cli_runs.open_store(reconciled=not reconcile) as store:
            if reconcile:  # the same pass, saying also which running runs it could not judge
                cli_runs.report(cli_runs.reconcile_store(store, state_dir()), verbose=True)
            runs = store.list_runs(experiment=experiment, limit=limit)
            if as_json:
                typer.echo(json.dumps([run_summary(r) for r in runs], indent=2))
            elif not runs:
                typer.echo(f"no runs recorded in {store.url}" + (f" for {experiment}" if experiment else ""))
            else:
                console = _console()
                console.print(_runs_table(runs, console.width))
                if console.width < WIDE:
                    console.print(f"(config, parent and trigger: `alignflow show RUN`, or a terminal of {WIDE} "
                                  "columns)", highlight=False, markup=False)
                for line in config_notes(runs):
                    console.print(line, highlight=False, markup=False)
                for line in _left_jobs(store, runs):
                    # one line each, whatever the width: a job's path is copied from here
                    console.print(f"interrupted {line} (`alignflow cancel` kills it)", highlight=False,
                                  soft_wrap=True)
