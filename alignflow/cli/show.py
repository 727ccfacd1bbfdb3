"""`alignflow show RUN` and what the run commands share: finding an experiment file, printing a run view.

`run`, `rerun`, `reproduce` and `serve` drive the orchestrator, so they live with the flows (`flows/cli.py`) and
join this command line through the `alignflow.commands` entry point group: the core never imports it.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from alignflow.cli import fit
from alignflow.compare.formatting import fmt_duration, fmt_size
from alignflow.errors import ConfigError, did_you_mean, did_you_mean_file

if TYPE_CHECKING:
    from alignflow.runview import RunView
    from alignflow.store import Store
    from alignflow.store.records import StepRunRecord

_STATUS_STYLE = {"ran": "green", "cached": "cyan", "failed": "bold red", "skipped": "dim", "running": "yellow"}


def resolve_experiment(name_or_path: str) -> Path:
    """A path as given, else `experiments/<name>.yaml`."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"{path}: file not found{did_you_mean_file(path)}")
        return path
    candidate = Path("experiments") / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = experiment_names()
    raise ConfigError(f"unknown experiment '{name_or_path}'{did_you_mean(name_or_path, known)}; experiments/ has: "
                      f"{', '.join(known) or 'nothing'}")


def experiment_names(incomplete: str = "") -> list[str]:
    """The experiments under ./experiments (also the shell completion of an experiment argument)."""
    return sorted(p.stem for p in Path("experiments").glob("*.yaml") if p.stem.startswith(incomplete))


def console() -> Console:
    """A console for tables: the terminal's width (or $COLUMNS); 120 columns when piped without $COLUMNS."""
    plain = Console()
    if plain.is_terminal or os.environ.get("COLUMNS"):
        return plain
    return Console(width=120)


def print_view(view: RunView, *, seconds: float | None = None) -> None:
    """`alignflow show RUN`: status and verdict first, the error, the steps in pipeline order, criteria, report.

    Each duration is labelled (issue 47: "took 5.1 s" and `time: 8.4 s` read as two answers to one question): `run
    time` is the run's wall time, as recorded; `command time` (after `alignflow run`, `seconds`) the command's."""
    out = console()
    verdict = (view.verdict or "none").upper()
    color = "green" if view.verdict == "pass" else "red" if view.verdict else "yellow"
    status_color = {"completed": "green", "running": "yellow"}.get(view.status, "bold red")
    out.print(f"run [bold]{view.run_id}[/] of {escape(view.experiment)}: [{status_color}]{view.status}[/], "
              f"verdict [bold {color}]{verdict}[/]", highlight=False)
    facts = [f"trigger {view.trigger}", f"started {_when(view.started)}"]
    if view.duration_s is not None:
        facts.append(f"run time {fmt_duration(view.duration_s)}")
    if view.parent_id:
        facts.append(f"parent {view.parent_id}")
    if view.config_sha256:
        facts.append(f"config {view.config_sha256[:8]}" + (f" ({view.experiment_file})" if view.experiment_file
                                                           else ""))
    facts.append(view.code_version)
    out.print("  " + " · ".join(facts), highlight=False, markup=False)
    if view.error:
        out.print(f"[bold red]error:[/] {escape(view.error)}", highlight=False)
    table = Table(header_style="bold", title="steps", title_justify="left")
    rows = []
    for s in view.steps:
        outs = ", ".join(f"{a.name} {a.sha256[:12]} ({fmt_size(a.size_bytes)})" for a in s.artifacts)
        if s.reused_from:
            outs += f" [reused: step run {s.reused_from} of run {s.reused_from_run}]"
        rows.append([s.step, s.status, s.host or "", "" if s.exit_code is None else str(s.exit_code),
                     fmt_duration(s.duration_s), outs])
    fit.add_columns(table, ["step", "status", "host", "exit", "duration", "outputs (sha256)"], rows,
                    [False, False, False, True, True, False], out.width)
    for row in rows:
        style = _STATUS_STYLE.get(row[1], "")
        table.add_row(row[0], f"[{style}]{row[1]}[/]" if style else row[1], *row[2:5], escape(row[5]))
    out.print(table)
    failed = [s for s in view.steps if s.status == "failed" and s.error and s.error != view.error]
    for s in failed:
        out.print(f"[red]{s.step}:[/] {escape(s.error or '')}", highlight=False)
    if view.criteria:
        crit = Table(header_style="bold", title="criteria", title_justify="left")
        rows = [[c.label, c.value_text, c.threshold_text, "PASS" if c.passed else "FAIL",
                 "" if c.first_outside is None else str(c.first_outside), ", ".join(map(str, c.driving_steps))]
                for c in view.criteria]
        fit.add_columns(crit, ["criterion", "value", "threshold", "result", "diverges at", "driving steps"], rows,
                        [False, True, True, False, True, False], out.width)
        for row in rows:
            crit.add_row(escape(row[0]), row[1], row[2], "[green]PASS[/]" if row[3] == "PASS" else "[bold red]FAIL[/]",
                         *row[4:])
        out.print(crit)
    if view.not_run:
        out.print(not_run_line(view), highlight=False, markup=False)
    if view.matrix is not None:
        print_matrix(out, view)
    if view.report:
        out.print(f"report:  {view.report}", highlight=False, markup=False)
    if seconds is not None:  # the command's wall time: the run's, plus what came before it (Prefect's start-up)
        out.print(f"command time: {fmt_duration(seconds)} (the run, plus the checks and Prefect before it)",
                  highlight=False)


def not_run_line(view: RunView) -> str:
    """What a partial run did not run: `not run: gpu_train, compare (not selected for this run; no verdict)`."""
    verdict = "" if view.step("compare") is None or "compare" not in view.not_run else "; no verdict"
    return f"not run: {', '.join(view.not_run)} (not selected for this run{verdict})"
def print_matrix(out: Console, view: RunView) -> None:
    """The switch matrix of a run: each variant's verdict against what it was expected to show, the report."""
    assert view.matrix is not None
    verdict = str(view.matrix.get("verdict") or "none")
    table = Table(header_style="bold", title=f"matrix: {verdict.upper()}", title_justify="left")
    for col in ("group", "variant", "verdict", "expected", "status", "run"):
        table.add_column(col, overflow="fold")
    for v in view.variants:
        shown = str(v.get("outcome") or v.get("verdict") or "").upper()
        good = bool(v.get("as_expected"))
        table.add_row(str(v.get("group")), str(v.get("name")), f"[{'green' if good else 'bold red'}]{shown}[/]",
                      str(v.get("expect")), str(v.get("status")), str(v.get("run_id") or ""))
    out.print(table)
    for reason in view.matrix.get("reasons") or ():
        out.print(f"[red]matrix:[/] {escape(str(reason))}", highlight=False)
    if view.matrix.get("report"):
        out.print(f"matrix:  {view.matrix['report']}", highlight=False, markup=False)


def _when(value: datetime | None) -> str:
    return "" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def run_of(store: Store, ident: str) -> tuple[str, StepRunRecord | None]:
    """The run an id a user typed names: a run id (or unique prefix), else a step run id — the 12-hex ids that
    `show` prints beside steps (`reused: step run ID of run RUN`) and the progress lines label `step run` — whose
    run it is, with that step run. Neither: `RecordNotFound` saying both were looked for."""
    from alignflow.errors import RecordNotFound

    try:
        return store.get_run(ident).id, None
    except RecordNotFound as exc:
        if "no such id" not in str(exc):
            raise  # an ambiguous run id prefix: more characters, not another kind of id
    try:
        step = store.get_step(ident)
    except RecordNotFound as exc:
        if "no such id" not in str(exc):
            raise
        raise RecordNotFound(f"run {ident!r}: no such id, nor a step run's - see `alignflow history`") from None
    return step.run_id, step


def show_run(run_id: str, *, as_json: bool) -> None:
    """Print one recorded run (the body of `show RUN` and `history RUN`; a step run's id shows its run and says
    which step it is); exit 2 when there is no store yet (a read-only command does not create one as a side
    effect). Runs whose controller died are reconciled first."""
    from alignflow.cli.runs import open_store
    from alignflow.runview import run_view

    with open_store(existing=True) as store:
        found, step = run_of(store, run_id)
        view = run_view(store, found)
    if as_json:
        doc = view.model_dump(mode="json")
        if step is not None:
            doc["step_run"] = {"id": step.id, "step": step.step}
        typer.echo(json.dumps(doc, indent=2))
        return
    if step is not None:
        reused = f", reused from step run {step.reused_from}" if step.reused_from else ""
        console().print(f"step run {step.id} is step {step.step} ({step.status}{reused}) of run {found}:",
                        highlight=False, markup=False)
    print_view(view)


def register(app: typer.Typer) -> None:
    @app.command("show")
    def show_cmd(
        run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough), or a step run's id (its run)."),
        as_json: bool = typer.Option(False, "--json", help="Print the run view as JSON (with schema_version)."),
    ) -> None:
        """Show a run: status, verdict, error, trigger, parent, steps in pipeline order, artifacts, criteria. A step
        run's id (`reused: step run ID`) shows the run it belongs to.

        Exit 0, 2 when RUN is unknown.
        """
        show_run(run_id, as_json=as_json)
