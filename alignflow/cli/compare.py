"""`alignflow compare TEST_LOG REF_LOG` and `alignflow logs parse LOG`.

Exit codes of `compare`: 0 the alignment passes, 1 it fails (a verdict, with its reasons), 2 bad input (a log
that cannot be read or has no step lines, a malformed criteria file, conflicting options).
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from alignflow.compare.comparison import Comparison
    from alignflow.logs import ParsedLog

EXIT_PASS, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


class LogFormatOption(StrEnum):
    auto = "auto"
    mindformers = "mindformers"
    megatron = "megatron"


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


def _parse(path: Path, fmt: LogFormatOption, rank: int | None, first_interval: FirstIntervalOption) -> ParsedLog:
    from alignflow.errors import LogParseError
    from alignflow.logs import parse_log_file

    try:
        return parse_log_file(path, fmt=fmt.value, rank=rank, first_interval=first_interval.value)
    except LogParseError as exc:
        raise _bad_input(str(exc)) from None


def _print_sentinels(parsed: ParsedLog, label: str) -> None:
    for s in parsed.sentinels:
        tag = "FATAL" if s.fatal else "warning"
        typer.echo(f"{tag}: {label}: {s.describe(parsed.source)}", err=True)


def register(app: typer.Typer) -> None:
    @app.command("compare")
    def compare_cmd(
        test_log: Path = typer.Argument(..., help="Log of the side under test (e.g. the NPU / MindFormers run)."),
        ref_log: Path = typer.Argument(..., help="Log of the reference side (e.g. the GPU / Megatron run)."),
        criteria: Path | None = typer.Option(None, "--criteria", help="Criteria file (`criteria: [...]`); "
                                             "default: the seeds' criteria."),
        out: Path | None = typer.Option(None, "--out", help="Write the report (HTML, markdown, CSV, PNG, JSON) here."),
        as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout."),
        test_format: LogFormatOption = typer.Option(LogFormatOption.auto, "--test-format", help="Test log format."),
        ref_format: LogFormatOption = typer.Option(LogFormatOption.auto, "--ref-format", help="Reference log format."),
        test_rank: int | None = typer.Option(None, "--test-rank", help="Rank of a multi-rank test log "
                                             "(default: the last pipeline stage)."),
        ref_rank: int | None = typer.Option(None, "--ref-rank", help="Rank of a multi-rank reference log."),
        first_interval: FirstIntervalOption = typer.Option(FirstIntervalOption.auto, "--first-interval",
                                                           help=_FIRST_INTERVAL_HELP),
        title: str = typer.Option("alignflow comparison", "--title", help="Report title."),
        labels: str = typer.Option("test,reference", "--labels", help="Names of the two sides, comma-separated."),
        plots: bool = typer.Option(True, "--plots/--no-plots", help="Draw PNG plots into the report."),
        lr_tolerance: int = typer.Option(1, "--lr-tolerance", min=0, help="Steps the lr may lead or lag."),
        warmup_steps: int = typer.Option(10, "--warmup-steps", min=0, help="Steps left out of the speed figures."),
    ) -> None:
        """Compare two training logs by the acceptance criteria; exit 0 pass, 1 fail, 2 bad input."""
        from alignflow.compare.comparison import compare
        from alignflow.compare.criteria import Criterion, default_criteria
        from alignflow.config import load_criteria
        from alignflow.errors import ConfigError

        names = tuple(part.strip() for part in labels.split(","))
        if len(names) != 2 or not all(names):
            raise _bad_input(f"--labels needs two names separated by a comma, got {labels!r}")
        try:
            rules = [c for c in load_criteria(criteria) if isinstance(c, Criterion)] if criteria else default_criteria()
        except ConfigError as exc:
            raise _bad_input(str(exc)) from None
        test = _parse(test_log, test_format, test_rank, first_interval)
        reference = _parse(ref_log, ref_format, ref_rank, first_interval)
        result = compare(test, reference, rules, lr_step_tolerance=lr_tolerance, perf_warmup_steps=warmup_steps)
        report_path: Path | None = None
        if out is not None:
            from alignflow.compare.report import write_report

            report_path = write_report(result, out, title=title, labels=(names[0], names[1]), plots=plots).html
        if as_json:
            sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
        else:
            _print_comparison(result, (names[0], names[1]), report_path)
        raise typer.Exit(EXIT_PASS if result.passed else EXIT_FAIL)

    logs_app = typer.Typer(help="Training logs: parse MindFormers and Megatron step lines.", no_args_is_help=True)

    @logs_app.command("parse")
    def parse_cmd(
        log: Path = typer.Argument(..., help="A MindFormers or Megatron training log."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object per step (a list)."),
        as_csv: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
        fmt: LogFormatOption = typer.Option(LogFormatOption.auto, "--format", help="Log format."),
        rank: int | None = typer.Option(None, "--rank", help="Rank of a multi-rank log (default: the last "
                                        "pipeline stage)."),
        check: bool = typer.Option(False, "--check", help="Exit 1 when a fatal sentinel line is found."),
        first_interval: FirstIntervalOption = typer.Option(FirstIntervalOption.auto, "--first-interval",
                                                           help=_FIRST_INTERVAL_HELP),
    ) -> None:
        """Print the parsed per-step table of a log; sentinel lines and the first-interval note go to stderr."""
        if as_json and as_csv:
            raise _bad_input("--json and --csv exclude each other")
        parsed = _parse(log, fmt, rank, first_interval)
        frame = parsed.frame
        if as_json:
            sys.stdout.write(json.dumps(_records(frame)) + "\n")
        elif as_csv:
            sys.stdout.write(frame.to_csv())
        else:
            typer.echo(parsed.summary())
            typer.echo(frame.to_string())
        _print_sentinels(parsed, str(log))
        if parsed.first_interval is not None and parsed.first_interval.intervals:
            typer.echo(f"note: {log}: {parsed.first_interval.describe()}", err=True)
        raise typer.Exit(EXIT_FAIL if check and parsed.fatal_sentinels else EXIT_PASS)

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
            item[key] = int(value) if key in INTEGER_COLUMNS and float(value).is_integer() else float(value)
        out.append(item)
    return out


def _print_comparison(result: Comparison, labels: tuple[str, str], report: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from alignflow.compare.formatting import fmt_stat
    from alignflow.compare.report import criteria_table, first_interval_lines

    console = Console(highlight=False)
    style = "bold green" if result.passed else "bold red"
    console.print(f"[{style}]verdict: {result.verdict.upper()}[/]  ({labels[0]} vs {labels[1]}; "
                  f"{result.steps.compared} step(s) compared)")
    for reason in result.reasons:
        console.print(f"  - {reason}", markup=False)
    header, rows = criteria_table(result)
    table = Table(*header[:5])
    for row in rows:
        table.add_row(*row[:5])
    console.print(table)
    metrics = Table("metric", "n", "ME", "max |e|", "mean rel", "max rel")
    for m, mc in result.metrics.items():
        s, q, mag = mc.stats, mc.resolution, mc.magnitude
        metrics.add_row(m, str(s.n), fmt_stat(s.me, "me", q, mag), fmt_stat(s.max_abs, "max_abs", q, mag),
                        fmt_stat(s.mean_rel, "mean_rel", q, mag), fmt_stat(s.max_rel, "max_rel", q, mag))
    console.print(metrics)
    st = result.steps
    lines: list[str] = []
    if st.only_test:
        lines.append(f"{len(st.only_test)} step(s) only in {labels[0]}")
    if st.only_reference:
        lines.append(f"{len(st.only_reference)} step(s) only in {labels[1]}")
    for side, label in (("test", labels[0]), ("reference", labels[1])):
        found = result.sentinels[side]
        if found:
            lines.append(f"{label}: {len(found)} sentinel line(s), {sum(s.fatal for s in found)} fatal")
    lines += first_interval_lines(result, labels)
    for line in lines:
        console.print(line, markup=False)
    if report is not None:
        console.print(f"report: {report}", markup=False)
