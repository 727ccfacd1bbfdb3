"""`alignflow golden record|check|list`: each side of a run against its own golden values.

Exit codes: `check` 0 when every side with goldens is within its margins, 1 when one is out (the first step and
metric named), 2 when nothing has goldens yet (or another usage error); `record` 0, or 2 when the run has no
completed training to record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from alignflow.pipeline import SIDE_NAMES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from alignflow.config.golden import Margin
    from alignflow.runner.engine import StepRunner
    from alignflow.store import Store

_SIDES: tuple[str, ...] = SIDE_NAMES


def _sides(side: list[str] | None) -> tuple[str, ...]:
    chosen = tuple(side or _SIDES)
    unknown = [s for s in chosen if s not in _SIDES]
    if unknown:
        typer.echo(f"error: --side {unknown[0]!r}: the sides are {' and '.join(_SIDES)}", err=True)
        raise typer.Exit(2)
    return chosen


def _runner_for(store: Store, state: Path) -> Callable[[str], StepRunner]:
    from alignflow.runner.engine import StepRunner
    from alignflow.runner.session import open_run
    from alignflow.transport import open_transport

    return lambda rid: StepRunner(open_run(store, rid), store=store, state_dir=state, transport_factory=open_transport)


def register(app: typer.Typer) -> None:
    golden = typer.Typer(help="Golden values per side: record a run's curves, memory and speed; check runs against "
                         "them (Megatron's and MindSpeed-LLM's CI margins).", no_args_is_help=True)
    app.add_typer(golden, name="golden")

    @golden.command("record")
    def record_cmd(
        run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough); a matrix run records its "
                                     "variants too."),
        side: list[str] | None = typer.Option(None, "--side", help="npu or gpu (repeatable); default: both."),
        note: str | None = typer.Option(None, "--note", help="Why these values are the new goldens."),
        as_json: bool = typer.Option(False, "--json", help="Print the recorded versions as JSON."),
    ) -> None:
        """Record the run's per-step values (losses, grad norm, step time) and memory as the next golden version
        of its experiment's sides.

        Exit 0 recorded, 2 on a usage or configuration error (RUN unknown or not complete).
        """
        from alignflow.cli.runs import open_store
        from alignflow.runner.goldens import record_goldens
        from alignflow.state import state_dir

        sides = _sides(side)
        state = state_dir()
        with open_store(existing=True) as store:
            records = record_goldens(store, run_id, sides=sides, runner_for=_runner_for(store, state),
                                     local_dir=state / "goldens", note=note)
        if as_json:
            typer.echo(json.dumps([{k: v for k, v in r.to_json().items() if k != "values"} for r in records],
                                  indent=2))
            return
        for r in records:
            steps = len(r.values.get("steps") or [])
            typer.echo(f"golden {r.experiment} {r.side} v{r.version}: {steps} steps from run {r.run_id} (log "
                       f"{r.log_sha256[:12]})")

    @golden.command("check")
    def check_cmd(
        run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough); a matrix run checks its "
                                     "variants too."),
        side: list[str] | None = typer.Option(None, "--side", help="npu or gpu (repeatable); default: both."),
        defaults: str | None = typer.Option(None, "--defaults", help="Margin set instead of the experiment's "
                                            "`golden.defaults`: megatron or mindspeed."),
        as_json: bool = typer.Option(False, "--json", help="Print the check as JSON."),
    ) -> None:
        """Check each side of the run against its newest golden values; name the first step and metric out of
        margin.

        Exit 0 every side within its margins, 1 a step out of margin, 2 on a usage or configuration error (no golden
        values, RUN unknown).
        """
        from alignflow.cli.runs import open_store
        from alignflow.config.golden import DEFAULT_MARGINS
        from alignflow.runner.goldens import check_goldens
        from alignflow.runner.session import open_run
        from alignflow.state import state_dir

        sides = _sides(side)
        if defaults is not None and defaults not in DEFAULT_MARGINS:
            typer.echo(f"error: --defaults {defaults!r}: use {' or '.join(DEFAULT_MARGINS)}", err=True)
            raise typer.Exit(2)
        state = state_dir()
        noted: set[tuple[str, ...]] = set()
        with open_store(existing=True) as store:
            def margins_for(rid: str) -> Mapping[str, Margin]:
                experiment = open_run(store, rid).experiment
                if defaults is None:
                    return experiment.golden.resolved()
                margins, skipped = experiment.golden.with_defaults(defaults)
                if skipped and (experiment.name, *skipped) not in noted:
                    noted.add((experiment.name, *skipped))
                    typer.echo(f"note: {experiment.name}: the {defaults} set has no margin for "
                               f"{', '.join(skipped)} (in its golden.metrics): not checked", err=True)
                return margins

            check = check_goldens(store, run_id, sides=sides, runner_for=_runner_for(store, state),
                                  local_dir=state / "goldens", margins_for=margins_for)
        if as_json:
            typer.echo(json.dumps(check.to_json(), indent=2))
        else:
            for s in check.sides:
                head = f"{s.experiment} {s.side}: {s.status.upper()}"
                if s.golden_version is not None:
                    head += f" against golden v{s.golden_version} (run {s.golden_run})"
                typer.echo(head + (f" — {s.note}" if s.note else ""))
                if s.first is not None:
                    typer.echo(f"  first out of margin: {s.first.text()}")
                    if len(s.failures) > 1:
                        typer.echo(f"  {len(s.failures) - 1} more value(s) out of margin")
                if s.status == "pass":
                    typer.echo(f"  checked: {', '.join(s.checked)}")
        if check.verdict == "no golden":
            if not as_json:
                typer.echo(f"error: no golden values for run {run_id}'s experiment: record them with `alignflow "
                           f"golden record RUN` first", err=True)
            raise typer.Exit(2)
        raise typer.Exit(0 if check.verdict == "pass" else 1)

    @golden.command("list")
    def list_cmd(
        experiment: str = typer.Argument(..., help="Experiment name (a matrix variant: `demo-matrix/01_recompute`)."),
        as_json: bool = typer.Option(False, "--json", help="Print the versions as JSON (without the values)."),
    ) -> None:
        """Every recorded version of an experiment's golden values, newest first.

        Exit 0, 2 on a usage or configuration error.
        """
        from alignflow.cli.runs import open_store
        from alignflow.errors import RecordNotFound, did_you_mean

        with open_store(existing=True) as store:
            known = store.golden_experiments()
            try:
                records = store.goldens(experiment)
            except RecordNotFound:  # a name no run was recorded under: a typo, most likely
                records = []
        if not records:
            hint = did_you_mean(experiment, known)
            typer.echo(f"error: {experiment!r}: no golden values recorded{hint}; experiments with golden values: "
                       f"{', '.join(known) or 'none yet (alignflow golden record RUN)'}", err=True)
            raise typer.Exit(2)
        if as_json:
            typer.echo(json.dumps([{k: v for k, v in r.to_json().items() if k != "values"} for r in records],
                                  indent=2))
            return
        for r in records:
            typer.echo(f"{r.experiment} {r.side} v{r.version}  run {r.run_id}  {r.created_at:%Y-%m-%d %H:%M}  "
                       f"{len(r.values.get('steps') or [])} steps" + (f"  — {r.note}" if r.note else ""))
