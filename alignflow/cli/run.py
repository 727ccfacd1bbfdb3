"""`alignflow run | rerun | show | reproduce` — the product's main commands.

`run` and `rerun` execute the Prefect alignment flow (the CLI is the application's outermost layer, the one
place in this package allowed to reach up into `flows/`; the core modules never import Prefect). Without a
`PREFECT_API_URL` Prefect starts a temporary local server for the run (a few seconds).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from alignflow.errors import AlignflowError, ConfigError

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


def _flow_run(**params: Any) -> dict[str, Any]:
    """Record the run, then hand it to the Prefect flow; whatever happens, report the recorded run."""
    from alignflow.runner.run import show, start_run
    from alignflow.runner.session import RunOptions
    from flows.alignment import alignment
    from tasks.context import open_store, state_dir

    options = RunOptions(from_step=params.get("from_step"), only=tuple(params.get("only") or ()),
                         force=tuple(params.get("force") or ()), parent=params.get("parent_run"),
                         trigger=params.get("trigger", "cli"), reuse_parent=bool(params.get("reuse_parent")),
                         reproduce_of=params.get("reproduce_of"))
    store = open_store()
    try:
        run_id = start_run(params["experiment"], params["hosts"], store=store, state_dir=state_dir(),
                           options=options)
    finally:
        store.close()
    try:
        result: dict[str, Any] = alignment(**params, run_id=run_id)
        return result
    except Exception as exc:
        # The flow recorded the failure; print the recorded run (its error says what went wrong).
        store = open_store()
        try:
            record = show(store, run_id)
        finally:
            store.close()
        if record["status"] == "running":
            raise AlignflowError(f"run {run_id}: the flow ended without closing the run: {exc}") from exc
        return record


def _finish(record: dict[str, Any], as_json: bool, started: float) -> None:
    if as_json:
        typer.echo(json.dumps(record, indent=2))
    else:
        print_record(record, seconds=time.monotonic() - started)
    raise typer.Exit(0 if record.get("verdict") == "pass" and record.get("status") == "completed" else 1)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_cmd(
        experiment: str = typer.Argument(..., help="Experiment file or name under experiments/."),
        hosts: Path = typer.Option(Path("hosts.yaml"), "--hosts", help="Host inventory."),
        from_step: str | None = typer.Option(None, "--from", help="Re-execute this step and everything after it."),
        only: list[str] = typer.Option([], "--only", help="Run only these steps (repeatable)."),
        force: list[str] = typer.Option([], "--force", help="Re-execute these steps and what depends on them."),
        parent: str | None = typer.Option(None, "--parent", help="Parent run whose artifacts may be reused."),
        as_json: bool = typer.Option(False, "--json", help="Print the run record as JSON."),
    ) -> None:
        """Run an alignment experiment end to end; exit 0 when the verdict is pass."""
        started = time.monotonic()
        path = resolve_experiment(experiment)
        record = _flow_run(experiment=str(path), hosts=str(hosts), from_step=from_step, only=list(only) or None,
                           force=list(force) or None, parent_run=parent, reuse_parent=parent is not None,
                           trigger="cli")
        _finish(record, as_json, started)

    @app.command("rerun")
    def rerun_cmd(
        run_id: str = typer.Argument(..., help="The run to re-run a step of (it becomes the parent)."),
        step: str = typer.Option(..., "--step", help="The step to re-execute (with everything that depends on it)."),
        as_json: bool = typer.Option(False, "--json", help="Print the new run record as JSON."),
    ) -> None:
        """A new run whose parent is RUN: re-executes STEP and its dependents, reuses the rest."""
        from alignflow import pipeline
        from tasks.context import open_store

        pipeline.step(step)
        started = time.monotonic()
        store = open_store()
        try:
            parent = store.get_run(run_id)
        finally:
            store.close()
        params = parent.params
        record = _flow_run(experiment=params["experiment_path"], hosts=params["hosts_path"], force=[step],
                           parent_run=parent.id, reuse_parent=True, trigger="rerun")
        _finish(record, as_json, started)

    @app.command("show")
    def show_cmd(
        run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Show a run: steps, hosts, statuses, artifacts with sha256, verdict, report."""
        from alignflow.runner.run import show
        from tasks.context import open_store

        store = open_store()
        try:
            record = show(store, store.get_run(run_id).id)
        finally:
            store.close()
        if as_json:
            typer.echo(json.dumps(record, indent=2))
        else:
            print_record(record)

    @app.command("reproduce")
    def reproduce_cmd(
        run_id: str = typer.Argument(..., help="The run to reproduce from its recorded inputs."),
        as_json: bool = typer.Option(False, "--json", help="Print the differences as JSON."),
    ) -> None:
        """Run again from the recorded experiment and inventory; list every fingerprint that differs."""
        from alignflow.runner.reproduce import diff_runs
        from tasks.context import open_store

        store = open_store()
        try:
            original = store.get_run(run_id)
        finally:
            store.close()
        record = _flow_run(experiment=original.params["experiment_path"], hosts=original.params["hosts_path"],
                           parent_run=original.id, trigger="reproduce", reproduce_of=original.id)
        if record["status"] != "completed":
            print_record(record)
            raise typer.Exit(1)
        store = open_store()
        try:
            diffs = diff_runs(store, original.id, record["run_id"])
        finally:
            store.close()
        real = [d for d in diffs if d.substantive]
        if as_json:
            typer.echo(json.dumps({"original": original.id, "reproduction": record["run_id"],
                                   "reproduced": not real,
                                   "differences": [{"what": d.what, "original": d.original,
                                                    "reproduction": d.reproduction, "note": d.note}
                                                   for d in diffs]}, indent=2))
        else:
            print_record(record)
            if diffs:
                Console().print(f"[bold yellow]{len(diffs)} fingerprint(s) differ from run {original.id}:[/]")
                for d in diffs:
                    note = f"  ({d.note})" if d.note else ""
                    typer.echo(f"  {d.what}: {d.original} -> {d.reproduction}{note}")
            verdict = "reproduced" if not real else f"NOT reproduced: {len(real)} substantive difference(s)"
            Console().print(f"[bold]{verdict}[/] — every checkpoint, input and logged metric compared with run "
                            f"{original.id}")
        raise typer.Exit(1 if real else 0)
