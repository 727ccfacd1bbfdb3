"""What a run shows on the terminal: `--quiet`, the default, `--verbose`.

- default: one line per finished step and the trainings' live progress (`alignflow.cli.progress.ConsoleProgress`,
  fed by the step tasks through `tasks.progress.observing`); Prefect's console handler shows only WARNING and above
  (its engine's "Finished in state Completed()" and the task logs would repeat what the display says);
- `--verbose`: the display with every message, and Prefect's console logs at INFO;
- `--quiet`: no display, warnings only; the command prints the result.

Prefect's API log handler is never touched: the UI keeps every line. Prefect logs to the terminal through a
`PrefectConsoleHandler` on the root logger (prefect/logging/logging.yml), whose rich console writes to the stream
it was built with - past the live display, over its rows. While the display is up, that console is the display's
(`_ThroughDisplay`): each record is printed above the rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from alignflow.errors import AlignflowError, ConfigError

Verbosity = Literal["quiet", "normal", "verbose"]


def verbosity_of(quiet: bool, verbose: bool) -> Verbosity:
    if quiet and verbose:
        raise ConfigError("--quiet and --verbose exclude each other")
    return "quiet" if quiet else "verbose" if verbose else "normal"


def quiet_prefect(verbosity: Verbosity) -> None:
    """Set the terminal's share of Prefect's logging for `verbosity` (after Prefect configured its handlers)."""
    import prefect.main  # noqa: F401 - importing it configures Prefect's logging (prefect/logging/logging.yml)
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            handler.setLevel(logging.NOTSET if verbosity == "verbose" else logging.WARNING)
            for old in [f for f in handler.filters if isinstance(f, _NoFinalStates)]:
                handler.removeFilter(old)
            handler.addFilter(_NoFinalStates(verbosity))
    if verbosity == "verbose":  # the core's own loggers (transfers, caches) too
        logging.getLogger("alignflow").setLevel(logging.DEBUG)


class _NoFinalStates(logging.Filter):
    """Off `--verbose`, the engine's `Finished in state Cancelled(...)` / `Failed(...)` records (logged at ERROR)
    stay in the UI: the display's step lines and the run's summary say the same. So does its `Task run failed with
    exception` record of an `AlignflowError`, a traceback of what is the user's to fix (a host that does not
    resolve, a failed job): the step's line and the run's error say it in one line (issue 45)."""

    def __init__(self, verbosity: Verbosity) -> None:
        super().__init__()
        self.verbosity = verbosity

    def filter(self, record: logging.LogRecord) -> bool:
        if self.verbosity == "verbose":
            return True
        if record.exc_info and isinstance(record.exc_info[1], AlignflowError):
            return False
        return not str(record.msg).startswith("Finished in state ")


@contextmanager
def terminal(verbosity: Verbosity) -> Iterator[None]:
    """While inside: the progress display of this process's runs (none when quiet)."""
    quiet_prefect(verbosity)
    if verbosity == "quiet":
        yield
        return
    from alignflow.cli.progress import ConsoleProgress
    from tasks.progress import observing

    with ConsoleProgress(verbose=verbosity == "verbose") as display, observing(display), _prefect_through(display):
        yield


class _ThroughDisplay:
    """Stands in for a `PrefectConsoleHandler`'s rich console (its `emit` calls `console.print(message, ...)`)."""

    def __init__(self, display: Any) -> None:
        self.display = display

    def print(self, message: object, *args: object, **kwargs: object) -> None:
        self.display.log_line(str(message))


@contextmanager
def _prefect_through(display: Any) -> Iterator[None]:
    from prefect.logging.handlers import PrefectConsoleHandler

    handlers = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    saved = [h.console for h in handlers]
    for handler in handlers:
        handler.console = _ThroughDisplay(display)  # type: ignore[assignment]
    try:
        yield
    finally:
        for handler, console in zip(handlers, saved, strict=True):
            handler.console = console
