"""A declared step-line format: a regular expression whose named groups are canonical columns.

For a trainer whose log none of the known families reads (a `command` side's own script): `step` is the 1-based
optimizer step (required), `max_steps` the total when printed, and every other group a canonical column
(`lm_loss`, `grad_norm`, `lr`, `mtp_1_loss`, ...: `alignflow.logs.schema`) whose printed number is read with its
resolution, as the framework parsers read theirs. A line the expression does not match is not a step line; one it
matches with a group that is not a number is an unreadable step line, reported with its line number.

    regex_format(r"step (?P<step>\\d+)/(?P<max_steps>\\d+) loss (?P<lm_loss>\\S+) gnorm (?P<grad_norm>\\S+)")
"""

from __future__ import annotations

import re

from alignflow.logs.formats import LogFormatSpec
from alignflow.logs.lines import MAX_STEP, StepLine

_SPECIAL = ("step", "max_steps")


def regex_format(pattern: str) -> LogFormatSpec:
    """The format whose step lines `pattern` matches; `ValueError` for a pattern that cannot be one."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"log regex {pattern!r} does not compile: {exc}") from None
    groups = set(rx.groupindex)
    if "step" not in groups:
        raise ValueError(f"log regex {pattern!r} has no (?P<step>...) group: the step number of each line")
    columns = sorted(groups - set(_SPECIAL))
    if not columns:
        raise ValueError(f"log regex {pattern!r} names no metric: add a group per column, e.g. (?P<lm_loss>\\S+)")

    def parse_step(text: str, with_resolution: bool) -> StepLine | str | None:
        m = rx.search(text)
        if m is None:
            return None
        try:
            step = int(m.group("step"))
            last = int(m.group("max_steps")) if "max_steps" in groups and m.group("max_steps") else None
        except ValueError:
            return "the step (or max_steps) group is not an integer"
        if not 1 <= step <= MAX_STEP:
            return "step number out of range"
        values: dict[str, float] = {}
        for column in columns:
            token = m.group(column)
            if token is None:
                continue
            try:
                values[column] = float(token)
            except ValueError:
                return f"group {column}: {token[:40]!r} is not a number"
        rec = StepLine(step=step, values=values, variant="regex", max_steps=last)
        rec.check_finite()
        if with_resolution:
            for column in columns:
                if m.group(column) is not None:
                    rec.set_resolution(column, m.group(column))
        return rec

    return LogFormatSpec(
        name="declared", label="declared", title=f"declared regex {pattern}", is_step_line=lambda text: True,
        parse_step=parse_step, rules=(), markers=(), known_columns=frozenset(columns),
        loss_columns=("lm_loss",) if "lm_loss" in columns else (),
    )
