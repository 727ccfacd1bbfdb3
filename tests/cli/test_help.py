"""Every command's help and every usage error in the house style of click and typer (issue 47; alignflow.cli.style).

The help of each command is rendered at 80 and 200 columns as a user's terminal would show it; usage errors go
through `main()`, which chooses the exit code and prints the one line.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from alignflow.cli import app, main

ROOT = typer.main.get_command(app)


def _commands(command: Any = ROOT, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not sub.hidden:
            yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands())
LEAVES = [path for path, command in COMMANDS.items() if not hasattr(command, "commands")]


def _help(path: tuple[str, ...], width: int) -> str:
    done = CliRunner().invoke(app, [*path, "--help"], prog_name="alignflow",
                              env={"COLUMNS": str(width), "TERMINAL_WIDTH": None, "NO_COLOR": "1"})
    assert done.exit_code == 0, done.output
    return done.output


def _label(path: tuple[str, ...]) -> str:
    return " ".join(path) or "alignflow"


def test_every_command_is_checked() -> None:
    assert len(LEAVES) > 40
    assert {("run",), ("compare",), ("convert", "bf16"), ("golden", "check"), ("server", "start")} <= set(LEAVES)


@pytest.mark.parametrize("path", list(COMMANDS), ids=_label)
def test_help_reads_like_click(path: tuple[str, ...]) -> None:
    text = _help(path, 80)
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    # metavars upper-case: EXPERIMENT, [RUN_ID], LOGS..., never typer 0.29's {experiment} / [run_id]
    for word in usage.split("[OPTIONS]", 1)[1].split():
        assert re.fullmatch(r"\[?[A-Z][A-Z0-9_]*\]?(\.\.\.)?|COMMAND|\[ARGS\]\.\.\.", word), (usage, word)
    assert not re.search(r"<(str|int|float|bool|path|file|dir)\b|list\[", text), text
    assert "…" not in text, text


@pytest.mark.parametrize("path", [(), *LEAVES], ids=_label)
def test_every_command_gives_its_exit_codes(path: tuple[str, ...]) -> None:
    text = " ".join(_help(path, 200).split())
    assert re.search(r"\bexit( codes:| with)? [0-2]\b", text, re.IGNORECASE), text


def _greedy(lines: list[str], width: int) -> list[str]:
    """Lines that broke early: the next line's first word would have fitted on them (a manual line break)."""
    return [line for line, following in itertools.pairwise(lines)
            if line.strip() and following.strip()
            and len(line.rstrip()) + 1 + len(following.split()[0]) <= width]


@pytest.mark.parametrize("path", list(COMMANDS), ids=_label)
def test_descriptions_wrap_at_the_terminal_width_not_at_the_source_lines(path: tuple[str, ...]) -> None:
    width = 200
    text = _help(path, width)
    description = text.split("╭", 1)[0].splitlines()[3:]  # after the usage line and its padding
    assert _greedy(description, width - 1) == [], text
    if hasattr(COMMANDS[path], "commands"):  # each command's cell of the Commands panel
        panel = text[text.index("─ Commands ─"):].splitlines()[1:-1]
        start = len(panel[0]) - len(panel[0][2:].split(" ", 1)[1].lstrip())
        cells: list[list[str]] = []
        for line in panel:
            if line[2:start].strip():
                cells.append([])
            cells[-1].append(line[start:-1].rstrip())
        assert [line for cell in cells for line in _greedy(cell, width - start - 2)] == [], text


def _main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
          *args: str) -> tuple[int, str]:
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(sys, "argv", ["alignflow", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["convert", "bf16", "experiments/demoo.yaml", "out"],
     "convert bf16: Invalid value for 'SRC': path 'experiments/demoo.yaml' does not exist (did you mean "
     "'experiments/demo.yaml'?); see '"),
    (["run", "--verbos", "demo"], "No such option: --verbos (did you mean '--verbose'?)"),
    (["runn"], "No such command 'runn' (did you mean 'run'?)"),
    (["compare"], "compare: Missing argument 'LOGS'"),
    (["compare", "--test-format", "x", "a", "b"], "'x': use auto or a registered log format: mindformers"),
    (["golden", "check"], "Missing argument 'RUN_ID'"),
])
def test_a_usage_error_is_one_line_with_the_closest_name(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         args: list[str], message: str) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    code, err = _main(capsys, monkeypatch, tmp_path, *args)
    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith("error: "), err
    assert message in err, err


@pytest.mark.parametrize("args", [["--bogus"], ["run", "--bogus", "demo"], ["bogus"]])
def test_a_far_name_gets_no_suggestion(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path, args: list[str]) -> None:
    code, err = _main(capsys, monkeypatch, tmp_path, *args)
    assert code == 2
    assert "did you mean" not in err.lower(), err


def test_a_missing_experiment_file_names_the_closest(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    code, err = _main(capsys, monkeypatch, tmp_path, "validate", "experiments/demoo.yaml")
    assert code == 2
    assert "experiments/demoo.yaml: file not found (did you mean 'experiments/demo.yaml'?)" in err
