"""The commands that drive the orchestrator: `alignflow run | rerun | reproduce` (`serve`: flows/serve_cli.py;
`server` and `ui`: flows/server_cli.py).

They join the `alignflow` command line through the `alignflow.commands` entry point group (pyproject.toml), so
the core library stays free of Prefect: `alignflow.cli` knows nothing of this module, and a host that only
converts or trains (`python -m alignflow convert ...`) never loads it. Prefect itself is imported inside the
commands, so `alignflow --help` stays fast.

`run` and `rerun` execute the alignment flow; without a `PREFECT_API_URL` they use the Prefect server alignflow
owns (flows/server.py: the one `alignflow server start` keeps, else one started for the run). Usage mistakes are
found before Prefect is imported (exit 2, in well under a second). A run ends printing where the Prefect UI shows
it; Ctrl-C cancels it (exit 130) and prints the `rerun` that continues it.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from alignflow.errors import ConfigError
from flows.console import Verbosity, terminal, verbosity_of

if TYPE_CHECKING:
    from alignflow.runner.control import Canceller
    from alignflow.runner.reproduce import Reproduction
    from alignflow.runview import RunView
    from alignflow.store import RunRecord


def register(app: typer.Typer) -> None:
    """Entry point of the `alignflow.commands` group: add this module's commands to `app`."""
    _register_run(app)
    from flows.serve_cli import register_serve
    from flows.server_cli import register_ui, server_app

    register_serve(app)
    app.add_typer(server_app(), name="server")
    register_ui(app)


# alignflow.cli's names are imported where they are used: importing this module first (a test, a script) loads
# alignflow.cli, whose registration of the `alignflow.commands` entry points loads this module's `register`.
def _complete_experiment(incomplete: str) -> list[str]:
    from alignflow.cli.show import experiment_names

    return experiment_names(incomplete)


def _complete_step(incomplete: str) -> list[str]:
    from alignflow import pipeline

    return [s for s in pipeline.STEP_NAMES if s.startswith(incomplete)]


def check_steps(*names: str | None, steps: tuple[str, ...] | None = None, owner: str = "alignflow") -> None:
    """Every named step is one of `steps` (default: every step alignflow knows), else a usage error (exit 2) that
    names the closest step and lists `steps`: those of the experiment once it is loaded, not steps it does not
    have (issue 47)."""
    from alignflow import pipeline
    from alignflow.errors import did_you_mean

    known = pipeline.STEP_NAMES if steps is None else steps
    for name in filter(None, names):
        if name not in known:
            if name in pipeline.STEP_NAMES:  # a step of other experiments' pipelines
                raise ConfigError(f"{owner} has no step '{name}' (its pipeline is derived from its checkpoint "
                                  f"formats); its steps are: {', '.join(known)}")
            raise ConfigError(f"unknown step '{name}'{did_you_mean(name, known)}; {owner}'s steps are: "
                              f"{', '.join(known)}")


def check_run_inputs(experiment: Path, hosts: Path, *steps: str | None, only: Sequence[str] = ()) -> None:
    """The experiment and the inventory load and agree, the steps named are the experiment's, and the names of the
    SSH hosts its steps (or the `only` ones) use resolve (file:line errors, exit 2) - in well under a second, before
    Prefect or any framework is imported."""
    # The loaders that alignflow.runner.session.load_run_inputs calls, without the runner's store (SQLAlchemy, 0.5 s)
    from alignflow.config import check_hosts, load_experiment, load_hosts

    inventory = load_hosts(hosts)
    loaded = load_experiment(experiment, inventory)
    check_hosts(loaded, inventory)
    check_pipeline_steps(loaded, *steps)
    check_host_names(loaded, inventory, only)


def check_host_names(experiment: Any, inventory: Any, only: Sequence[str] = ()) -> None:
    """Every SSH host that `experiment`'s steps (or the `only` ones) are placed on has a name that resolves, or a
    configuration error (exit 2) naming `hosts.NAME.address` at its line and the `doctor` check, before a Prefect
    server is started or a run recorded. Issue 45: a run against a `.invalid` address started a Prefect server,
    recorded a run and failed its first step, 12 to 40 s later. A resolver that does not answer is not a refusal
    (alignflow.transport.names)."""
    from alignflow.backends.registry import pipeline_for
    from alignflow.config.placement import place
    from alignflow.config.yamlsource import load_yaml
    from alignflow.state import state_dir
    from alignflow.transport.names import Unresolved, unresolved

    placement = place(experiment, inventory, state_dir=state_dir(), steps=only or pipeline_for(experiment).names)
    found = unresolved(placement.hosts.values())
    if not found:
        return
    source = inventory.source or "hosts.yaml"
    lines = load_yaml(source)

    def said(u: Unresolved) -> str:  # `hosts.npu-a.address: cannot resolve ...`, the doctor command to run as is
        return f"{'.'.join(u.key)}: {str(u.error).removeprefix(f'{u.error.host}: ')}".replace("<inventory>", source)

    raise ConfigError([(source, lines.line_of(u.key), said(u)) for u in found])


def check_pipeline_steps(experiment: Any, *steps: str | None) -> None:
    """Each named step is a step of `experiment`'s pipeline (derived from its checkpoint formats): a usage error,
    exit 2, before a Prefect server is started or a run recorded."""
    from alignflow.backends.registry import pipeline_for

    check_steps(*steps, steps=pipeline_for(experiment).names, owner=experiment.name)


@dataclass(frozen=True)
class Launched:
    """A run the flow executed: its record, where the UI shows it, and whether Ctrl-C stopped it."""

    record: Any
    link: str | None  # its flow run's page, on a Prefect server that outlives this command
    per_run_server: bool  # its Prefect server was started for it, and is gone
    ctrl_c: bool
    not_killed: str | None = None  # after Ctrl-C: the jobs the cancellation did not see end
    killed: int = 0  # after Ctrl-C: the jobs the cancellation saw end


def _flow_run(*, verbosity: Verbosity, **params: Any) -> Launched:
    """Record the run, then hand it to the Prefect flow; whatever happens, report the recorded run.

    Prefect is reached first (`flows.prefect_client.prefect_api`: the configured API, the kept server or one started
    for this run): a run that cannot reach Prefect fails before anything is recorded. Ctrl-C cancels the run: the
    flow kills its jobs and ends it `cancelled`, in the store and in Prefect (`Cancelled`).
    """
    from alignflow.cli.runs import open_store
    from alignflow.state import state_dir
    from flows.prefect_client import use_state_dir_for_prefect

    use_state_dir_for_prefect()
    from flows.prefect_client import prefect_api

    def say(message: str) -> None:  # waiting for another run's Prefect server to start
        if verbosity != "quiet":
            Console(stderr=True).print(f"prefect: {message}", highlight=False, soft_wrap=True)

    with prefect_api(state_dir(), events=say) as api, _CtrlC() as ctrl_c:
        per_run = api.server is not None and not api.server.kept
        if verbosity != "quiet" and api.server is not None and per_run:
            Console(stderr=True).print(f"prefect: a server for this run only, stopped with it (UI {api.server.ui}); "
                                       "`alignflow server start` keeps one for later runs", highlight=False,
                                       soft_wrap=True)
        from alignflow.runner.run import start_run
        from alignflow.runner.session import RunOptions
        from alignflow.runview import run_view
        from flows.alignment import alignment

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
        ctrl_c.cancels(run_id)
        from tasks.progress import observing

        link_of = _FlowRunLink()
        try:
            # the progress display (alignflow.cli.progress), per --quiet / --verbose
            with terminal(verbosity), observing(link_of):
                record: Any = alignment(**params, run_id=run_id)
        except KeyboardInterrupt:  # before the flow's walk began, or Ctrl-C again while it cancelled the run
            _cancelled_by_ctrl_c(run_id, api.url)
            record = {"run_id": run_id}
        except Exception as exc:
            # The flow recorded the failure; print the recorded run (its error says what went wrong). If it could
            # not (the Prefect server went away under it), the run is interrupted here, with the cause.
            store = open_store(quiet=True)
            try:
                if store.get_run(run_id).status == "running":
                    store.interrupt_run(run_id, reason=f"the flow ended without closing the run ({exc}; Prefect API "
                                                       f"{api.url}); `alignflow rerun {run_id}` continues it")
                record = run_view(store, run_id)
            finally:
                store.close()
        # the flow announced its flow run's page; asked of the API only if it never got that far
        link = None if per_run else (link_of.link or _run_link(api.url, run_id))
    cancelled = ctrl_c.canceller
    return Launched(record, link, per_run, ctrl_c.seen, cancelled.failure if cancelled else None,
                    len(cancelled.killed) if cancelled else 0)


class _FlowRunLink:
    """Observes this process's runs (tasks.progress.RunObserver) for one thing: the UI page of the flow run that the
    flow announces as it starts."""

    def __init__(self) -> None:
        self.link: str | None = None

    def run_link(self, name: str, link: str | None) -> None:
        self.link = self.link or link

    def message(self, text: str) -> None:
        pass

    def progress(self, progress: object) -> None:
        pass

    def step_ended(self, step: str, status: str, detail: str) -> None:
        pass


class _CtrlC:
    """While inside (in the main thread): Ctrl-C is remembered; until a run is recorded it raises KeyboardInterrupt
    as always. Once `cancels(run_id)` names the run, the first Ctrl-C cancels it through the runner's one path (a
    `Canceller`: its own thread, `cancel_run_jobs`) and raises nothing; the steps see their jobs end, killed, and
    the flow ends `Cancelled`. A second Ctrl-C raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.seen = False
        self.canceller: Canceller | None = None
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.canceller is None or self.seen:
            self.seen = True
            signal.default_int_handler(signum, frame)
        self.seen = True
        self.canceller.request("stopped by Ctrl-C")

    def cancels(self, run_id: str) -> None:
        """From now on the first Ctrl-C cancels `run_id` (the run this command recorded)."""
        if self._previous is None:
            return
        from alignflow.runner.control import Canceller, cancel_run_jobs
        from tasks.context import open_store, transport_factory

        def cancel(why: str) -> list[str]:  # the store the flow's tasks use: open, migrated, nothing to reconcile
            return cancel_run_jobs(open_store(), run_id, transport_factory=transport_factory(), why=why)

        self.canceller = Canceller(run_id, cancel)

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.canceller is not None:
            self.canceller.close()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _cancelled_by_ctrl_c(run_id: str, api_url: str) -> None:
    """Ctrl-C reached the command, not the flow's walk: kill what the run started, record it cancelled, and make its
    flow run (which Prefect recorded `Crashed`) `Cancelled` too."""
    from alignflow.cli.runs import open_store
    from alignflow.runner.control import cancel_run_jobs
    from alignflow.transport import open_transport
    from flows.prefect_client import cancel_flow_run

    with open_store(quiet=True) as store:
        cancel_run_jobs(store, run_id, transport_factory=open_transport, why="stopped by Ctrl-C")
    cancel_flow_run(api_url, run_id, message=f"run {run_id} cancelled: stopped by Ctrl-C")


def _run_link(api_url: str, run_id: str) -> str | None:
    from flows.prefect_client import find_flow_run, run_link

    try:
        found = find_flow_run(api_url, run_id)
    except ConfigError:
        return None
    return None if found is None else run_link(found.id)


def _view(record: Any) -> Any:
    """The recorded run as `alignflow show` sees it (alignflow.runview), whatever shape the flow returned."""
    from alignflow.cli.runs import open_store
    from alignflow.runview import RunView, run_view

    if isinstance(record, Launched):
        record = record.record
    run_id = record.run_id if isinstance(record, RunView) else record["run_id"]
    store = open_store(quiet=True)
    try:
        return run_view(store, run_id)
    finally:
        store.close()


def print_link(launched: Launched, run_id: str) -> None:
    """Where the Prefect UI shows the run."""
    console = Console(highlight=False)
    if launched.link:
        console.print(f"ui:      {launched.link}", markup=False, soft_wrap=True)
    elif launched.per_run_server:
        console.print(f"ui:      `alignflow ui {run_id}` opens it (its Prefect server stopped with the run; "
                      "`alignflow server start` keeps one)", markup=False, soft_wrap=True)


def _finish(launched: Launched | Any, as_json: bool, started: float, verbosity: Verbosity = "normal") -> None:
    """Print the run as `show` does (`--json`, `--quiet`), where the UI shows it, then exit with the run's code."""
    from alignflow.cli.show import not_run_line, print_view

    if not isinstance(launched, Launched):  # a bare record (a RunView, or the flow's JSON)
        launched = Launched(launched, link=None, per_run_server=False, ctrl_c=False)
    view = _view(launched)
    if as_json:
        typer.echo(json.dumps(view.model_dump(mode="json"), indent=2))
    elif verbosity == "quiet":
        typer.echo(f"run {view.run_id}: {view.status}, verdict {(view.verdict or 'none').upper()}"
                   + (f", report {view.report}" if view.report else "")
                   + (f"\nerror: {view.error}" if view.error else "")
                   + (f"\n{not_run_line(view)}" if view.not_run else ""))
    else:
        print_view(view, seconds=time.monotonic() - started)
        print_link(launched, view.run_id)
    if launched.ctrl_c:
        jobs = (f"not every job was seen to end: {launched.not_killed}" if launched.not_killed
                else "its jobs were killed" if launched.killed or any("killed" in (s.error or "") for s in view.steps)
                else "no job was running")
        Console(stderr=True, highlight=False).print(
            f"run {view.run_id} {view.status} (Ctrl-C): {jobs}; `alignflow rerun {view.run_id}` "
            "continues it, reusing every step that finished", markup=False, soft_wrap=True)
        raise typer.Exit(130)
    from flows.alignment import SIGTERM_WHY

    if view.status == "cancelled" and (view.error or "").endswith(SIGTERM_WHY):
        raise typer.Exit(143)  # 128 + SIGTERM, as an interrupted command exits (alignflow.cli.main)
    raise typer.Exit(view.exit_code)


_QUIET = typer.Option(False, "--quiet", "-q", help="Only the result (and warnings); no progress lines.")
_VERBOSE = typer.Option(False, "--verbose", "-v", help="Also Prefect's own logs and alignflow's debug lines.")


def run_cmd(
    experiment: str = typer.Argument(..., help="Experiment file or name under experiments/.",
                                     autocompletion=_complete_experiment),
    hosts: Path = typer.Option(Path("hosts.yaml"), "--hosts", help="Host inventory."),
    from_step: str | None = typer.Option(None, "--from", metavar="STEP",
                                         help="Re-execute this step and everything after it.",
                                         autocompletion=_complete_step),
    only: list[str] = typer.Option([], "--only", metavar="STEP", help="Run only these steps (repeatable).",
                                   autocompletion=_complete_step),
    force: list[str] = typer.Option([], "--force", metavar="STEP",
                                    help="Re-execute these steps and what depends on them.",
                                    autocompletion=_complete_step),
    parent: str | None = typer.Option(None, "--parent", metavar="RUN", help="Parent run whose artifacts may be "
                                      "reused."),
    as_json: bool = typer.Option(False, "--json", help="Print the run record as JSON."),
    quiet: bool = _QUIET,
    verbose: bool = _VERBOSE,
) -> None:
    """Run an alignment experiment end to end; exit 0 when the verdict is pass, 1 when not, 2 on a usage or
    configuration error."""
    from alignflow.cli.show import resolve_experiment

    started = time.monotonic()
    verbosity = verbosity_of(quiet, verbose)
    path = resolve_experiment(experiment)
    check_run_inputs(path, hosts, from_step, *only, *force, only=only)
    if parent is not None:
        from alignflow.cli.runs import open_store

        with open_store(existing=True) as store:
            parent = store.get_run(parent).id
    record = _flow_run(verbosity=verbosity, experiment=str(path), hosts=str(hosts), from_step=from_step,
                       only=list(only) or None, force=list(force) or None, parent_run=parent,
                       reuse_parent=parent is not None, trigger="cli")
    _finish(record, as_json, started, verbosity)


def rerun_cmd(
    run_id: str = typer.Argument(..., help="The run to re-run (it becomes the parent)."),
    step: str | None = typer.Option(None, "--step", metavar="STEP",
                                    help="Re-execute this step and what depends on it; without it, every step the "
                                    "run did not finish (an interrupted or failed run continues).",
                                    autocompletion=_complete_step),
    as_json: bool = typer.Option(False, "--json", help="Print the new run record as JSON."),
    quiet: bool = _QUIET,
    verbose: bool = _VERBOSE,
) -> None:
    """A new run whose parent is RUN: reuses every step RUN finished, executes the rest (or STEP and its
    dependents).

    Exit 0 when the verdict is pass, 1 when not (or the run failed), 2 on a usage or configuration error.
    """
    check_steps(step)
    started = time.monotonic()
    verbosity = verbosity_of(quiet, verbose)
    parent = _rerunnable(run_id, step)
    params = parent.alignment_params()
    record = _flow_run(verbosity=verbosity, experiment=params.experiment_path, hosts=params.hosts_path,
                       force=[step] if step else None, parent_run=parent.id, reuse_parent=True, trigger="rerun")
    _finish(record, as_json, started, verbosity)


def reproduce_cmd(
    run_id: str = typer.Argument(..., help="The run to reproduce from its recorded inputs."),
    as_json: bool = typer.Option(False, "--json", help="Print the differences as JSON."),
    quiet: bool = _QUIET,
    verbose: bool = _VERBOSE,
) -> None:
    """Run again from the recorded experiment and inventory: reproduced or diverged, then every difference
    with its cause; exit 0 reproduced, 1 diverged (or the reproduction did not complete)."""
    from alignflow.cli.runs import open_store
    from alignflow.runner.reproduce import judge_reproduction

    store = open_store(existing=True)
    try:
        original = store.get_run(run_id)
    finally:
        store.close()
    params = original.alignment_params()
    record = _flow_run(verbosity=verbosity_of(quiet, verbose), experiment=params.experiment_path,
                       hosts=params.hosts_path, parent_run=original.id, trigger="reproduce",
                       reproduce_of=original.id)
    view = _view(record)
    if record.ctrl_c:
        _finish(record, as_json, started=time.monotonic(), verbosity="quiet" if quiet else "normal")
    if view.status != "completed":
        if as_json:
            doc = {"verdict": "incomplete", "reproduction": view.model_dump(mode="json")}
            typer.echo(json.dumps(doc, indent=2))
        else:
            Console().print(f"[bold red]NOT REPRODUCED[/]: the reproduction {view.run_id} ended {view.status}")
            from alignflow.cli.show import print_view

            print_view(view)
        raise typer.Exit(1)
    store = open_store()
    try:
        judged = judge_reproduction(store, original.id, view.run_id)
    finally:
        store.close()
    if as_json:
        # the verdict first, as the document has always opened
        doc = {"verdict": judged.verdict, **judged.model_dump(mode="json"),
               "reproduction_run": view.model_dump(mode="json")}
        typer.echo(json.dumps(doc, indent=2))
    else:
        _print_reproduction(judged, view)
    raise typer.Exit(0 if judged.verdict == "reproduced" else 1)


def _rerunnable(run_id: str, step: str | None = None) -> RunRecord:
    """The run `rerun` continues: not one still running, whose pipeline has `step`; the jobs an interrupted one left
    are ended first."""
    from alignflow.cli.runs import open_store
    from alignflow.store import RunStatus

    store = open_store(existing=True)
    try:
        parent = store.get_run(run_id)
        if parent.status == RunStatus.RUNNING:
            raise ConfigError(f"run {parent.id} is still running (driven by pid "
                              f"{(parent.controller or {}).get('pid', '?')}); wait for it, or `alignflow cancel "
                              f"{parent.id}` first")
        check_pipeline_steps(parent.alignment_params().experiment, step)
        if parent.status == RunStatus.INTERRUPTED:
            _end_left_jobs(store, parent.id)
    finally:
        store.close()
    return parent


def _print_reproduction(judged: Reproduction, view: RunView) -> None:
    """The headline, the differences (those that change nothing apart), then the reproduction run."""
    from alignflow.cli.show import print_view

    console = Console(highlight=False)
    color = "green" if judged.verdict == "reproduced" else "red"
    console.print(f"[bold {color}]{escape(judged.headline)}[/]")
    for title, group in (("differences", judged.substantive),
                         ("differences that change nothing",
                          tuple(d for d in judged.differences if not d.substantive))):
        if not group:
            continue
        table = Table(title=title, title_justify="left", header_style="bold")
        for col in ("what", "original", "reproduction", "cause"):
            table.add_column(col, overflow="fold", no_wrap=col == "what")
        for d in group:
            table.add_row(escape(d.what), _short(d.original), _short(d.reproduction), escape(d.note))
        console.print(table)
    print_view(view)


def _register_run(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
    app.command("rerun")(rerun_cmd)
    app.command("reproduce")(reproduce_cmd)


def _short(value: str | None) -> str:
    """A sha256 or cache key to its first 16 characters; anything else as it is."""
    if value is None:
        return "—"
    return value[:16] if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else escape(value)


def _end_left_jobs(store: Any, run_id: str) -> None:
    """Before a rerun of an interrupted run: its leftover jobs would compete for their hosts' slots and nobody would
    ever collect what they produce; end them (their steps run again, or come from the cache)."""
    from alignflow.cli.cancel import kill_interrupted_jobs
    from alignflow.transport import open_transport

    for line in kill_interrupted_jobs(store, run_id, transport_factory=open_transport):
        typer.echo(f"run {run_id}: ended a job its interruption left: {line}", err=True)
