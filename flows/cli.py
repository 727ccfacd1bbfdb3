"""The commands that drive the orchestrator: `alignflow run | rerun | reproduce | serve`.

They join the `alignflow` command line through the `alignflow.commands` entry point group (pyproject.toml), so
the core library stays free of Prefect: `alignflow.cli` knows nothing of this module, and a host that only
converts or trains (`python -m alignflow convert ...`) never loads it. Prefect itself is imported inside the
commands, so `alignflow --help` stays fast.

`run` and `rerun` execute the alignment flow; without a `PREFECT_API_URL` Prefect starts a temporary local server
for the run (a few seconds). `serve` registers the alignment and nightly deployments with a Prefect server and runs
their flow runs. Everything is checked before anything is registered: the inventory, every experiment file offered
in the UI, the nightly settings (experiments, cron, time zone), the Prefect server and the alignflow store — a
team server that starts with a broken piece would only fail at 2 a.m.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from alignflow.cli.show import print_record, resolve_experiment
from alignflow.errors import AlignflowError, ConfigError


def register(app: typer.Typer) -> None:
    """Entry point of the `alignflow.commands` group: add this module's commands to `app`."""
    _register_run(app)
    _register_serve(app)


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


def _register_run(app: typer.Typer) -> None:
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


def _api_url() -> str:
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise ConfigError("PREFECT_API_URL is not set: `alignflow serve` registers deployments with a Prefect "
                          "server; start one (`prefect server start`, or docker/compose.yaml) and export "
                          "PREFECT_API_URL=http://HOST:4200/api")
    return str(url)


def _check_server(api_url: str) -> None:
    import httpx

    try:
        ok = httpx.get(f"{api_url.rstrip('/')}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ConfigError(f"{api_url}: Prefect server not reachable ({exc}); is it running?") from None
    if ok is not True:
        raise ConfigError(f"{api_url}/health answered {ok!r}, not true")


def _register_serve(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        experiments: Path = typer.Option(Path("experiments"), "--experiments",
                                         help="Directory whose *.yaml experiments the UI offers."),
        hosts: Path = typer.Option(Path("hosts.yaml"), "--hosts", help="Host inventory every run uses."),
        nightly: Path | None = typer.Option(None, "--nightly",
                                            help="Nightly settings (experiments, cron, timezone, drift); "
                                                 "default: nightly.yaml when present."),
        cron: str | None = typer.Option(None, "--cron", help="Nightly schedule (default '0 2 * * *')."),
        timezone: str | None = typer.Option(None, "--timezone", help="Time zone of the schedule (default UTC)."),
        nightly_experiment: list[str] = typer.Option([], "--nightly-experiment",
                                                     help="Experiment of the nightly (repeatable; default: all)."),
        limit: int | None = typer.Option(None, "--limit", min=1, help="Most flow runs executing at once."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Build and print the deployments, then exit."),
        as_json: bool = typer.Option(False, "--json", help="With --dry-run: print the deployments as JSON."),
    ) -> None:
        """Serve the `alignment/launch` (UI form) and `nightly-regression/nightly` (cron) deployments until SIGTERM."""
        from flows.serve import describe, load_serve_spec, serve_deployments

        if nightly is None and Path("nightly.yaml").is_file():
            nightly = Path("nightly.yaml")
        spec = load_serve_spec(experiments, hosts, nightly, cron=cron, timezone=timezone,
                               nightly_experiments=list(nightly_experiment) or None)
        described = describe(spec)
        if dry_run and as_json:
            typer.echo(json.dumps(described, indent=2))
            raise typer.Exit(0)
        console = Console()
        table = Table(show_header=True, header_style="bold")
        for col in ("deployment", "schedule", "parameters"):
            table.add_column(col)
        for d in described:
            when = ", ".join(f"{s['cron']} ({s['timezone']})" for s in d["schedules"]) or "on demand"
            table.add_row(d["name"], when, ", ".join(d["parameters"]))
        console.print(table)
        console.print(f"experiments: {', '.join(spec.catalog.names)} ({spec.catalog.directory})", highlight=False)
        console.print(f"nightly:     {', '.join(spec.nightly.experiments or spec.catalog.names)}", highlight=False)
        if dry_run:
            raise typer.Exit(0)
        api = _api_url()
        _check_server(api)
        from tasks.context import open_store

        store = open_store()  # fails now, with the database named, if the store is unreachable or too new
        try:
            console.print(f"store:       {store.url}", highlight=False)
        finally:
            store.close()
        console.print(f"prefect:     {api} — UI {api.rstrip('/').removesuffix('/api')}/v2/deployments", highlight=False)
        serve_deployments(spec, limit=limit)
        console.print("stopped (schedules left active)")
