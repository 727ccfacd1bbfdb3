"""Prefect's log records on the terminal of `alignflow run` (issue 40: on Ctrl-C they were written over the live
display's rows)."""

from __future__ import annotations

import logging

from flows.console import _prefect_through, quiet_prefect


class Lines:
    """A display that keeps the log lines it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log_line(self, text: str) -> None:
        self.lines.append(text)


def test_prefect_log_records_go_through_the_display_and_engine_final_states_stay_in_the_ui() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    quiet_prefect("normal")
    (handler,) = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    before = handler.console
    display = Lines()
    logger = logging.getLogger("tests.flows.console")
    with _prefect_through(display):
        logger.warning("run 0123456789ab: Ctrl-C, cancelling it (its jobs are killed)")
        logger.error("Finished in state Cancelled('npu_reload_train: cancelled')")  # the display's step line says it
    assert handler.console is before  # put back
    assert len(display.lines) == 1
    assert display.lines[0].endswith("run 0123456789ab: Ctrl-C, cancelling it (its jobs are killed)")
    level = logging.getLogger("alignflow").level
    quiet_prefect("verbose")
    try:
        with _prefect_through(display):
            logger.error("Finished in state Cancelled('npu_reload_train: cancelled')")
    finally:
        quiet_prefect("normal")
        logging.getLogger("alignflow").setLevel(level)
    assert display.lines[-1].endswith("Finished in state Cancelled('npu_reload_train: cancelled')")
