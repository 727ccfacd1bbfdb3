"""The `alignflow` command line (typer + rich).

Each command group lives in its own module with a `register(app)` function; heavy imports (torch, MindSpore,
the orchestrator) happen inside the commands so that `alignflow --help` stays fast. Only the CLI chooses exit codes.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from alignflow.cli import style
from alignflow.errors import AlignflowError


class _CommandInterrupted(Exception):
    """A KeyboardInterrupt (Ctrl-C, or `alignflow.staging.Interrupted`) raised inside a command, carried past typer
    to `main()`: typer >= 0.29 turns it into a silent exit 130, also when every write of the command had completed
    (a Ctrl-C while it reported them), which `main()` must say and exit 0 for."""

    def __init__(self, interrupt: KeyboardInterrupt) -> None:
        super().__init__(repr(interrupt))
        self.interrupt = interrupt


class _Group(TyperGroup):
    def invoke(self, ctx: Any) -> Any:  # a click Context (typer vendors click: its module path is private)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise _CommandInterrupted(exc) from exc


app = typer.Typer(
    name="alignflow",
    cls=_Group,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
)

style.install()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"alignflow {importlib.metadata.version('alignflow')}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print alignflow's version and exit."),
) -> None:
    """Training-precision alignment experiments: MindSpore/MindFormers on Ascend vs Megatron-LM on CUDA.

    Exit codes: 0 pass, 1 a failed alignment (or run), 2 a usage or configuration error.
    """


# Command modules, in help order. A module that is not there yet is skipped.
_COMMAND_MODULES = (
    "validate", "preflight", "render", "hosts", "doctor", "convert", "compare", "data", "twin", "hash", "db",
    "history", "show", "golden", "export", "diagnose", "cancel", "gc",
)
# Commands of other packages (`run`, `rerun`, `reproduce`, `serve`, defined in flows/cli.py): `register(app)`
# named by entry points of this group, registered first (they are the product's main commands).
COMMAND_GROUP = "alignflow.commands"


def _register_all() -> None:
    for entry in sorted(importlib.metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        entry.load()(app)
    for name in _COMMAND_MODULES:
        module_name = f"alignflow.cli.{name}"
        if importlib.util.find_spec(module_name) is None:
            continue
        importlib.import_module(module_name).register(app)


_register_all()


def _interrupted(err: Console, exc: KeyboardInterrupt | None) -> NoReturn:
    """Exit for an interruption: 128 + the signal (`alignflow.staging.Interrupted` carries 143 for SIGTERM), or 0
    when it came after every write of the command had completed (while it reported them: they are whole)."""
    from alignflow.staging import Interrupted, completed_in_process

    done = completed_in_process()
    if done and exc is not None and not isinstance(exc, Interrupted):
        err.print(f"interrupted after {', '.join(map(str, done))} completed: the result is whole", highlight=False,
                  soft_wrap=True)
        sys.exit(0)
    err.print("interrupted")
    sys.exit(getattr(exc, "exit_code", 130))


def _caches_in_state_dir() -> None:
    """matplotlib (the reports' plots) keeps its font cache in `$MPLCONFIGDIR`, default `~/.config/matplotlib` and
    `~/.cache/matplotlib`: put it under the state dir, where alignflow keeps everything it writes (unless set)."""
    import os

    from alignflow.state import state_dir

    if "MPLCONFIGDIR" not in os.environ:
        os.environ["MPLCONFIGDIR"] = str(state_dir() / "cache" / "matplotlib")


def _interrupt_beneath(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt an exception was raised from, if any: Python 3.11 turns one that lands while a class is
    created (a pydantic model, imported as a command starts) into `RuntimeError: Error calling __set_name__`
    (tests/faults/test_interrupted_writers.py: a Ctrl-C 0.04 s into `convert megatron` printed that traceback)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def main() -> None:
    """Console-script entry point: run the app and map alignflow errors to their exit codes."""
    err = Console(stderr=True)
    try:
        _caches_in_state_dir()  # inside: a Ctrl-C this early is an interrupted command too, not a traceback
        # In non-standalone mode click *returns* the code of a `typer.Exit` raised by a command.
        rc = app(standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except AlignflowError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _interrupted(err, exc)
    except _CommandInterrupted as exc:
        _interrupted(err, exc.interrupt)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.exceptions.Abort | typer.Abort):  # click's wrapping of a KeyboardInterrupt
            _interrupted(err, exc.__cause__ if isinstance(exc.__cause__, KeyboardInterrupt) else None)
        interrupt = _interrupt_beneath(exc)
        if interrupt is not None:  # a Ctrl-C wrapped by Python itself: inside a class body's __set_name__ (3.11)
            _interrupted(err, interrupt)
        # typer >= 0.29 vendors click (typer._click): its exceptions are not `click.ClickException`s, so
        # recognise a click error by its interface (show + exit_code; usage errors carry exit code 2).
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if not (callable(show) and isinstance(code, int)):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "format_message"):
            show()  # a group named alone: its help
        else:  # one line, as every alignflow error (click prints the usage, a hint and a boxed message)
            err.print(f"[bold red]error:[/] {escape(style.usage_error_line(exc))}", markup=True, highlight=False,
                      soft_wrap=True)
        sys.exit(code)
    sys.exit(rc if isinstance(rc, int) else 0)
