"""`alignflow compare REF_LOG TEST_LOG [TEST_LOG...]` and `alignflow logs parse LOG`.

Exit codes of `compare`: 0 the alignment passes, 1 it fails (a verdict, with its reasons), 2 bad input (a log
that cannot be read or has no step lines, a malformed criteria file, conflicting options), always with the file,
the line where known and the reason, never a traceback. `logs parse`: 0, or 1 under `--check` when the log has a
fatal sentinel (or misses a `--require`d line), 2 bad input.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from alignflow.compare.comparison import Comparison
    from alignflow.config.criteria import Criterion
    from alignflow.logs import ParsedLog

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2
CSV_FLOAT_FORMAT = "%.15g"


def _log_format(value: str) -> str:
    """`auto` or a registered log format (alignflow.logs.formats), checked against the registry when it is used."""
    from alignflow.logs.formats import names

    if value != "auto" and value not in names():
        raise typer.BadParameter(f"{value!r}: use auto or a registered log format: {', '.join(names())}")
    return value


_FORMAT_HELP = "log format: auto (detected) or a registered one's name (alignflow.logs.formats)."


class FirstIntervalOption(StrEnum):
    auto = "auto"
    deaverage = "deaverage"
    raw = "raw"


_FIRST_INTERVAL_HELP = ("Megatron's first printed interval: megatron-core >= 0.16 averages each run's first iteration "
                        "into its next line. auto: undo it when the log shows that version (microsecond timestamps); "
                        "deaverage: always undo it; raw: keep every value as printed.")


def _bad_input(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def _check_out_dir(out: Path) -> None:
    """`--out` is a directory of report files: refuse, before any work, a path that cannot become one."""
    if out.exists() and not out.is_dir():
        raise _bad_input(f"--out {out}: exists and is not a directory; the report is a directory of files (HTML, "
                         "CSV, PNG, JSON) - pass a new or existing directory")
    import os

    base = out
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise _bad_input(f"--out {out}: {base} is not a directory, so the report directory cannot be created there")
    if not os.access(base, os.W_OK | os.X_OK):
        raise _bad_input(f"--out {out}: {base} is not writable")


def _parse(path: Path, fmt: str, rank: int | None, first_interval: FirstIntervalOption) -> ParsedLog:
    from alignflow.errors import LogParseError
    from alignflow.logs import parse_log_file

    try:
        return parse_log_file(path, fmt=fmt, rank=rank, first_interval=first_interval.value)
    except LogParseError as exc:
        raise _bad_input(str(exc)) from None


def _memory(path: Path) -> list[Any]:
    """Every rank's memory report in the log (already read once by `_parse`: a read error cannot happen here)."""
    from alignflow.logs.memory import memory_lines

    with path.open("r", encoding="utf-8", errors="replace") as fh:
        return memory_lines(fh)


_REQUIRE_HELP = ("What the run(s) must show, repeatable: checkpoint_loaded = a checkpoint was loaded (the pipeline's "
                 "trainings set it; a run that started from random weights then fails). Other names: any marker "
                 "(see alignflow.logs.known_requirements).")


def _requirements(names: list[str] | None) -> tuple[str, ...]:
    from alignflow.logs import known_requirements

    known = known_requirements()
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise _bad_input(f"unknown --require {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(names or ())


def _print_sentinels(parsed: ParsedLog, label: str, require: tuple[str, ...] = ()) -> None:
    for s in parsed.sentinels:
        tag = "FATAL" if s.fatal_under(require) else "warning"
        typer.echo(f"{tag}: {label}: {s.describe(parsed.source)}", err=True)


def compare_cmd(
    logs: list[Path] = typer.Argument(..., help="The reference log (e.g. the GPU / Megatron run), then one or "
                                      "more test logs (e.g. NPU / MindFormers runs): error = test - reference. "
                                      "A recorded run's log: RUN:STEP (a run id or unique prefix and a training "
                                      "step), RUN alone for its npu_reload_train; one RUN alone: its gpu_train "
                                      "(reference) and npu_reload_train logs."),
    criteria: Path | None = typer.Option(None, "--criteria", help="Criteria file (`criteria: [...]`); "
                                         "default: the reference run's recorded criteria when it is a RUN, "
                                         "else the seeds' criteria."),
    out: Path | None = typer.Option(None, "--out", help="Write the report (HTML, markdown, CSV, PNG, JSON) here."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout."),
    test_format: str = typer.Option("auto", "--test-format", parser=_log_format, metavar="FORMAT",
                                    help="Test " + _FORMAT_HELP),
    ref_format: str = typer.Option("auto", "--ref-format", parser=_log_format, metavar="FORMAT",
                                   help="Reference " + _FORMAT_HELP),
    test_rank: int | None = typer.Option(None, "--test-rank", help="Rank of multi-rank test logs "
                                         "(default: the last pipeline stage)."),
    ref_rank: int | None = typer.Option(None, "--ref-rank", help="Rank of a multi-rank reference log."),
    first_interval: FirstIntervalOption = typer.Option(FirstIntervalOption.auto, "--first-interval",
                                                       help=_FIRST_INTERVAL_HELP),
    title: str | None = typer.Option(None, "--title", help="Report title (default: the logs it compares, tests "
                                     "first: `npu.log vs gpu.log`)."),
    labels: str | None = typer.Option(None, "--labels", help="Names of the logs in argument order (reference "
                                      "first), comma-separated; default reference,test (or the file names)."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Draw the curves (HTML) and PNG plots."),
    lr_tolerance: int = typer.Option(1, "--lr-tolerance", min=0, help="Steps the lr may lead or lag."),
    warmup_steps: int = typer.Option(10, "--warmup-steps", min=0, help="Steps left out of the speed figures."),
    require: list[str] | None = typer.Option(None, "--require", help=_REQUIRE_HELP),
    min_overlap: int | None = typer.Option(None, "--min-overlap", min=1, help="Fewest steps both logs must "
                                           "share (default: 10, or all of the shorter log's)."),
) -> None:
    """Compare test logs with a reference log by the acceptance criteria: `compare REF TEST [TEST...]`;
    exit 0 every test passes, 1 one fails, 2 bad input."""
    from alignflow.compare.comparison import compare

    typed = logs
    logs, run_labels, run_criteria = _logs_of_runs(logs)
    if len(logs) < 2:
        raise _bad_input("compare needs the reference log and at least one test log: compare REF TEST [TEST...] "
                         "(a log file, RUN or RUN:STEP)")
    names = _labels(labels, logs) if labels is not None or run_labels is None else run_labels
    required = _requirements(require)
    rules = _criteria(criteria, run_criteria)
    if out is not None:
        _check_out_dir(out)
    reference = _parse(logs[0], ref_format, ref_rank, first_interval)
    tests = [_parse(path, test_format, test_rank, first_interval) for path in logs[1:]]
    ref_memory = _memory(logs[0])
    results = [compare(t, reference, rules, lr_step_tolerance=lr_tolerance, perf_warmup_steps=warmup_steps,
                       require=required, min_overlap=min_overlap, memory=(_memory(path), ref_memory))
               for t, path in zip(tests, logs[1:], strict=True)]
    ordered = (*names[1:], names[0])  # the report's order: tests, then the reference
    if title is None:
        title = _title(run_labels or _log_names(typed), names)
    _report(results, ordered, out=out, title=title, plots=plots, as_json=as_json)
    raise typer.Exit(EXIT_PASS if all(r.passed for r in results) else EXIT_FAIL)


def _criteria(path: Path | None, recorded: list[Criterion] | None) -> list[Criterion]:
    """The criteria of `--criteria`, else the reference run's recorded ones, else the seeds'."""
    from alignflow.config import load_criteria
    from alignflow.config.criteria import Criterion, default_criteria
    from alignflow.errors import ConfigError

    try:
        return ([c for c in load_criteria(path) if isinstance(c, Criterion)] if path
                else recorded if recorded is not None else default_criteria())
    except ConfigError as exc:
        raise _bad_input(str(exc)) from None


def _report(results: list[Comparison], labels: tuple[str, ...], *, out: Path | None, title: str, plots: bool,
            as_json: bool) -> None:
    """Write the report under `out` (when given); print the comparisons, or their JSON."""
    report_path: Path | None = None
    if out is not None:
        from alignflow.compare.report import write_report

        report_path = write_report(results, out, title=title, labels=labels, plots=plots).html
    if as_json:
        from alignflow.compare.report import report_json

        sys.stdout.write(json.dumps(report_json(results, labels), indent=2) + "\n")
    else:
        _print_comparisons(results, labels, report_path)

def parse_cmd(
    log: Path = typer.Argument(..., help="A MindFormers or Megatron training log."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per step (a list)."),
    as_csv: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
    fmt: str = typer.Option("auto", "--format", parser=_log_format, metavar="FORMAT", help="The " + _FORMAT_HELP),
    rank: int | None = typer.Option(None, "--rank", help="Rank of a multi-rank log (default: the last "
                                    "pipeline stage)."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when a fatal sentinel line is found."),
    first_interval: FirstIntervalOption = typer.Option(FirstIntervalOption.auto, "--first-interval",
                                                       help=_FIRST_INTERVAL_HELP),
    require: list[str] | None = typer.Option(None, "--require", help=_REQUIRE_HELP + " Used by --check."),
) -> None:
    """Print the parsed per-step table of a log; sentinel lines and the first-interval note go to stderr.

    Exit 0, 1 when the log cannot be parsed, 2 on a usage or configuration error.
    """
    if as_json and as_csv:
        raise _bad_input("--json and --csv exclude each other")
    required = _requirements(require)
    parsed = _parse(log, fmt, rank, first_interval)
    frame = parsed.frame
    if as_json:
        sys.stdout.write(json.dumps(_records(frame)) + "\n")
    elif as_csv:
        # 15 significant digits: every printed decimal round-trips, the binary tails of computed cells
        # (de-averaged first-interval values: 1.0242419999999999) do not show.
        sys.stdout.write(frame.to_csv(float_format=CSV_FLOAT_FORMAT))
    else:
        typer.echo(parsed.summary())
        typer.echo(frame.to_string())
    _print_sentinels(parsed, str(log), required)
    if parsed.first_interval is not None and parsed.first_interval.intervals:
        typer.echo(f"note: {log}: {parsed.first_interval.describe()}", err=True)
    for name in parsed.missing(required):
        typer.echo(f"FATAL: {log}: required line not found: {name}", err=True)
    invalid = bool(parsed.fatal_under(required) or parsed.missing(required))
    raise typer.Exit(EXIT_FAIL if check and invalid else EXIT_PASS)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)
    logs_app = typer.Typer(help="Training logs: parse MindFormers and Megatron step lines.", no_args_is_help=True)
    logs_app.command("parse")(parse_cmd)
    app.add_typer(logs_app, name="logs")


def _records(frame: Any) -> list[dict[str, Any]]:
    """One JSON object per step: `step` and every column that has a value there (absent values left out)."""
    import pandas as pd

    from alignflow.logs.schema import INTEGER_COLUMNS

    out = []
    for step, row in zip(frame.index, frame.to_dict(orient="records"), strict=True):
        item: dict[str, Any] = {"step": int(step)}
        for key, value in row.items():
            if pd.isna(value):
                continue
            number = float(value)
            item[key] = int(number) if key in INTEGER_COLUMNS and number.is_integer() else float(f"{number:.15g}")
        out.append(item)
    return out


RUN_ARG = re.compile(r"^(?P<run>[0-9a-f]{4,12})(?::(?P<step>[a-z0-9_]+))?$")
DEFAULT_RUN_STEP = "npu_reload_train"  # a run named alone: the side under test


def _logs_of_runs(args: list[Path]) -> tuple[list[Path], tuple[str, ...] | None, list[Criterion] | None]:
    """The log files the arguments name: a path as it is; `RUN` or `RUN:STEP` (a run id that is not a file here)
    the controller's copy of that step's training log in the store's run (one `RUN` alone: its GPU log as the
    reference, its NPU log as the test, the run's own comparison). Labels `RUN:STEP` when any argument is a run,
    and the criteria the first run's experiment recorded (its noise thresholds resolved as its compare step does)."""
    parsed = [(arg, None if arg.exists() else RUN_ARG.match(str(arg))) for arg in args]
    if not any(m for _, m in parsed):
        return args, None, None
    if len(parsed) == 1:
        run = parsed[0][0]
        parsed = [(Path(f"{run}:gpu_train"), RUN_ARG.match(f"{run}:gpu_train")),
                  (Path(f"{run}:npu_reload_train"), RUN_ARG.match(f"{run}:npu_reload_train"))]
    from alignflow.cli.runs import open_store
    from alignflow.errors import AlignflowError

    out: list[Path] = []
    labels: list[str] = []
    criteria: list[Criterion] | None = None
    try:
        with open_store(existing=True) as store:
            for arg, m in parsed:
                if m is None:
                    out.append(arg)
                    labels.append(arg.stem)
                    continue
                path, label = _run_log(store, m.group("run"), m.group("step") or DEFAULT_RUN_STEP)
                out.append(path)
                labels.append(label)
                if criteria is None and len(out) == 1:  # the reference's run
                    criteria = _run_criteria(store, label.split(":")[0])
    except AlignflowError as exc:
        raise _bad_input(str(exc)) from None
    return out, tuple(labels) if len(set(labels)) == len(labels) else None, criteria


def _run_criteria(store: Any, run_id: str) -> list[Criterion] | None:
    """The acceptance criteria a run's experiment was recorded with (`alignflow.runner.compare_step` judges by);
    None for a run recorded without its experiment."""
    from alignflow.diagnose.noise import latest_noise_floor, resolve_criteria
    from alignflow.store.params import RunParams

    params = store.get_run(run_id).params
    if not isinstance(params, RunParams):
        return None
    experiment = params.experiment
    return resolve_criteria(experiment.criteria, latest_noise_floor(store, experiment.name))


def _run_log(store: Any, ident: str, step: str) -> tuple[Path, str]:
    """The training log `step` of run `ident` as fetched to this controller (`runs/<id>/logs/<step>.log` of the run
    that trained it), checked against the recorded sha256; the label `RUN:STEP`."""
    from alignflow import pipeline
    from alignflow.cli.show import run_of
    from alignflow.errors import ConfigError
    from alignflow.fingerprint import Fingerprinter
    from alignflow.state import state_dir

    spec = pipeline.known_step(step)
    if spec.log_source is None:
        trainings = ", ".join(n for n in pipeline.STEP_NAMES if pipeline.known_step(n).log_source)
        raise ConfigError(f"{ident}:{step}: {step} writes no training log; a run's logs are those of {trainings}")
    run_id, _ = run_of(store, ident)
    done = [s for s in store.steps(run_id) if s.step == step and s.status in ("ran", "cached")]
    if not done:
        have = sorted({s.step for s in store.steps(run_id) if s.status in ("ran", "cached")
                       and s.step in pipeline.STEP_NAMES and pipeline.known_step(s.step).log_source})
        raise ConfigError(f"run {run_id}: {step} did not run in it (its training logs: {', '.join(have) or 'none'})")
    origin = store.get_step(done[-1].reused_from) if done[-1].reused_from else done[-1]
    log_name = next(o.artifact for o in spec.outputs if o.path == "train.log")
    artifact = next(a for a in store.artifacts(origin.id) if a.name == log_name)
    for run in dict.fromkeys((origin.run_id, run_id)):  # where the engine fetched it, else where compare did
        local = state_dir() / "runs" / run / "logs" / f"{step}.log"
        if local.is_file() and Fingerprinter().fingerprint(local).sha256 == artifact.sha256:
            return local, f"{run_id}:{step}"
    raise ConfigError(f"run {run_id}: no copy of its {step} log on this machine with the recorded sha256 "
                      f"{artifact.sha256[:12]} (the log is {artifact.host}:{artifact.path})")


def _labels(given: str | None, logs: list[Path]) -> tuple[str, ...]:
    """Names of the logs in argument order: `--labels`, else reference/test, else the files' names."""
    if given is not None:
        names = tuple(part.strip() for part in given.split(","))
        if len(names) != len(logs) or not all(names) or len(set(names)) != len(names):
            raise _bad_input(f"--labels needs {len(logs)} distinct names separated by commas (reference first), "
                             f"got {given!r}")
        return names
    if len(logs) == 2:
        return ("reference", "test")
    stems = tuple(p.stem for p in logs)
    return stems if len(set(stems)) == len(stems) else ("reference", *(f"test {i}" for i in range(1, len(logs))))


def _log_names(logs: list[Path]) -> tuple[str, ...]:
    """Each log by its file's name; by its path as typed where two share a name (`a/train.log`, `b/train.log`)."""
    names = tuple(p.name for p in logs)
    return names if len(set(names)) == len(names) else tuple(str(p) for p in logs)


def _title(logs: Sequence[str], labels: Sequence[str]) -> str:
    """The report's title, by its logs, tests first as the report reads: `npu.log vs gpu.log`, with a label that
    says more than the name: `NPU (npu.log) vs GPU (gpu.log)` (issue 47: every report was 'alignflow comparison')."""
    named = [name if label in (name, Path(name).stem) else f"{label} ({name})"
             for name, label in zip(logs, labels, strict=True)]
    return f"{', '.join(named[1:])} vs {named[0]}"


def _abbreviated(cell: str, short: dict[str, str]) -> str:
    for name, abbreviation in short.items():
        cell = cell.replace(name, abbreviation)
    return cell


def _print_comparisons(results: list[Comparison], labels: tuple[str, ...], report: Path | None) -> None:
    """Verdict first, what failed with its driving steps, then the criteria and metric tables (fit the terminal)."""
    from rich.console import Console
    from rich.table import Table

    from alignflow.cli import fit
    from alignflow.compare import tables
    from alignflow.compare.report import numeric_columns, verdict_of

    console = Console(highlight=False)
    verdict = verdict_of(results)
    style = "bold green" if verdict == "pass" else "bold red"
    counts = ", ".join(f"{label}: {r.steps.compared} step(s)" for label, r in zip(labels, results, strict=False))
    console.print(f"[{style}]verdict: {verdict.upper()}[/]  ({' / '.join(labels[:-1])} vs {labels[-1]}, error = "
                  f"test - reference; {counts} compared)", highlight=False)
    for line in tables.failed_lines(results, labels):
        console.print(f"  - {line}", markup=False)
    for line in tables.divergence_lines(results, labels):
        console.print(f"  - {line}", markup=False, style="magenta")
    narrow = console.width < 100  # an 80-column terminal (alignflow.cli.fit)
    short = fit.abbreviations(m for r in results for m in r.metrics) if narrow else {}
    for t, keep in ((tables.criteria_table(results, labels), 6 + (len(results) > 1)),
                    (tables.metrics_table(results, labels), None)):
        header, rows = t.header[:keep], [r[:keep] for r in t.rows]
        if keep is None:  # the terminal table of metrics: the main statistics only
            shown = ["log", "metric", "n", "ME", "max |e|", "at step", "mean rel", "max rel", "diverges at"]
            if narrow:  # the statistics without the steps they occur at
                shown.remove("at step")
            wanted = [i for i, h in enumerate(t.header) if h in shown]
            header, rows = [t.header[i] for i in wanted], [[r[i] for i in wanted] for r in t.rows]
        rows = [[_abbreviated(cell, short) for cell in row] for row in rows]
        classes = t.row_classes or [""] * len(rows)
        # several test logs (labels: the tests', then the reference's): one table per log, not a column of labels
        groups = [(None, rows, classes)] if header[0] != "log" else [
            (label, [r[1:] for r in rows if r[0] == label], [c for r, c in zip(rows, classes, strict=True)
                                                             if r[0] == label]) for label in labels[:-1]]
        header = header if header[0] != "log" else header[1:]
        for label, group, group_classes in groups:
            table = Table(header_style="bold", title=None if label is None else f"{label} vs {labels[-1]}",
                          title_justify="left")
            fit.add_columns(table, header, group, numeric_columns(tables.Table(header, group)), console.width)
            for row, cls in zip(group, group_classes, strict=True):
                table.add_row(*row, style="red" if cls == "failed" else None)
            console.print(table)
    if short:
        console.print(f"abbreviated: {fit.legend(short)}", markup=False)
    lines = [line for line in tables.coverage_lines(results, labels) if not line.endswith(": none")
             and " compared " not in line]
    for label, found in tables.sentinel_logs(results, labels):
        if found:
            lines.append(f"{label}: {len(found)} sentinel line(s), {sum(s.fatal for s in found)} fatal")
    lines += tables.first_interval_lines(results, labels)
    lines += tables.restart_lines(results, labels)
    for line in lines:
        console.print(line, markup=False)
    if report is not None:
        console.print(f"report: {report}", markup=False)
