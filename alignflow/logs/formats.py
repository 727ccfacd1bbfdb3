"""The log formats alignflow reads, as data: one entry per framework family.

Each entry says how to find and read that family's step lines, which non-step lines are sentinels and markers,
which columns it is known to print (so a damaged key is reported, not silently taken as a new metric), and its
conventions: the loss every step line must carry and what a printed NaN grad norm means. `parse_log` tries the
entries in order on each line, so a more specific anchor (NeMo's `Training epoch E, iteration N/M |`) comes before
a more general one (Megatron's `iteration N/M |`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from alignflow.logs import megatron, mindformers, nemo
from alignflow.logs.lines import StepLine
from alignflow.logs.schema import LogFormat
from alignflow.logs.sentinels import LineRule, Marker


@dataclass(frozen=True, slots=True)
class LogFormatSpec:
    """One framework family's step lines, sentinel lines and conventions."""

    name: LogFormat
    label: str  # short name for messages
    title: str
    is_step_line: Callable[[str], bool]  # cheap substring pre-check; `parse_step` decides
    parse_step: Callable[[str, bool], StepLine | str | None]  # (text, with_resolution): None = no step line
    rules: tuple[LineRule, ...]
    markers: tuple[Marker, ...]
    known_columns: frozenset[str]
    known_pattern: re.Pattern[str] | None = None  # families of known columns (`mtp_<k>_loss`)
    # Every step line must print one of these (the first any line prints is the one): Megatron leaves a NaN or
    # non-positive loss out of the line, so a missing loss is a diverged step, not a missing field.
    loss_columns: tuple[str, ...] = ()
    # MindFormers prints `grad_norm: NaN` on every step when it does not compute the norm; in Megatron a printed
    # `nan` grad norm is a diverged run.
    nan_grad_norm_unreported: bool = False
    # A step whose line counts this many skipped iterations over its whole interval printed no real loss.
    skip_column: str | None = None
    # (a step line, the next physical line, whether the first ends inside a field) -> the two joined, when the
    # second continues the first (a wrapped line)
    continues: Callable[[str, str, bool], str | None] | None = None


MINDFORMERS = LogFormatSpec(
    name="mindformers", label="MindFormers", title="MindFormers (PyNative LossCallback, MFLossMonitor 0.6-2.x)",
    is_step_line=mindformers.is_step_line, parse_step=mindformers.parse_step, rules=mindformers.RULES,
    markers=mindformers.MARKERS, known_columns=mindformers.KNOWN_COLUMNS, known_pattern=mindformers.KNOWN_PATTERN,
    nan_grad_norm_unreported=True,
)
NEMO = LogFormatSpec(
    name="nemo", label="NeMo 2", title="NeMo 2 / Lightning ProgressPrinter", is_step_line=nemo.is_step_line,
    parse_step=nemo.parse_step, rules=(), markers=(), known_columns=nemo.KNOWN_COLUMNS, loss_columns=("lm_loss",),
)
MEGATRON = LogFormatSpec(
    name="megatron", label="Megatron", title="Megatron-LM / Megatron-DeepSpeed / ms-swift training_log",
    is_step_line=megatron.may_be_step_line, parse_step=megatron.parse_step, rules=megatron.RULES,
    markers=megatron.MARKERS, known_columns=megatron.KNOWN_COLUMNS, known_pattern=megatron.KNOWN_PATTERN,
    loss_columns=("lm_loss", "loss"), skip_column="skipped", continues=megatron.continues,
)
FORMATS: tuple[LogFormatSpec, ...] = (MINDFORMERS, NEMO, MEGATRON)
BY_NAME: dict[str, LogFormatSpec] = {spec.name: spec for spec in FORMATS}
FORMAT_NAMES: tuple[str, ...] = tuple(BY_NAME)


def all_rules() -> tuple[LineRule, ...]:
    return tuple(rule for spec in FORMATS for rule in spec.rules)


def all_markers() -> tuple[Marker, ...]:
    return tuple(marker for spec in FORMATS for marker in spec.markers)


def known_requirements() -> tuple[str, ...]:
    """Names a caller may require of a run (`check_sentinels(require=...)`, `--require`): every marker."""
    return tuple(sorted({m.name for m in all_markers()}))
