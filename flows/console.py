"""What a run shows on the terminal: `--quiet`, the default, `--verbose`.

- default: one line per finished step and the trainings' live progress (`alignflow.cli.progress.ConsoleProgress`,
  fed by the step tasks through `tasks.progress.observing`); Prefect's console handler shows only WARNING and above
  (its engine's "Finished in state Completed()" and the task logs would repeat what the display says);
- `--verbose`: the display with every message, and Prefect's console logs at INFO;
- `--quiet`: no display, warnings only; the command prints the result.

Prefect's API log handler is never touched: the UI keeps every line. Prefect logs to the terminal through a
`PrefectConsoleHandler` on the root logger (prefect/logging/logging.yml).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from alignflow.errors import ConfigError

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
    if verbosity == "verbose":  # the core's own loggers (transfers, caches) too
        logging.getLogger("alignflow").setLevel(logging.DEBUG)


@contextmanager
def terminal(verbosity: Verbosity) -> Iterator[None]:
    """While inside: the progress display of this process's runs (none when quiet)."""
    quiet_prefect(verbosity)
    if verbosity == "quiet":
        yield
        return
    from alignflow.cli.progress import ConsoleProgress
    from tasks.progress import observing

    with ConsoleProgress(verbose=verbosity == "verbose") as display, observing(display):
        yield
