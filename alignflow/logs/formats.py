"""The log formats alignflow reads: one registry (`FORMATS`), one `LogFormatSpec` per framework family.

Every name a user may give a log format (`parse_log(fmt=...)`, `alignflow logs parse --format`, a `command` side's
`log.format`) is read from this registry when it is used: a new format is its parser module and one `register`
call here (docs/architecture.md#where-code-goes); a test or a plugin may register one of its own.

Each entry says how to find and read that family's step lines, which non-step lines are sentinels and markers,
which columns it is known to print (so a damaged key is reported, not silently taken as a new metric), and its
conventions: the loss every step line must carry, what a printed NaN grad norm means, when a last line is whole.
`parse_log` tries the entries in order on each line, so a more specific anchor (NeMo's `Training epoch E, iteration
N/M |`) comes before a more general one (Megatron's `iteration N/M |`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from alignflow.logs import megatron, mindformers, nemo
from alignflow.logs.lines import StepLine
from alignflow.logs.sentinels import LineRule, Marker


@dataclass(frozen=True, slots=True)
class LogFormatSpec:
    """One framework family's step lines, sentinel lines and conventions."""

    name: str
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
    anchor: str = ""  # how a step line begins, for the message of a log without any
    # A step line is whole only when it ends with one of these: an unterminated last line of a log that otherwise
    # has line ends (still being written) that does not is left out. None: the parser itself sees a cut line.
    whole_line_ends: tuple[str, ...] | None = None
    # Megatron's first printed interval may average several iterations (megatron-core >= 0.16): undone per the
    # `first_interval` choice (alignflow.logs.first_interval).
    averages_first_interval: bool = False


MINDFORMERS = LogFormatSpec(
    name="mindformers", label="MindFormers", title="MindFormers (PyNative LossCallback, MFLossMonitor 0.6-2.x)",
    is_step_line=mindformers.is_step_line, parse_step=mindformers.parse_step, rules=mindformers.RULES,
    markers=mindformers.MARKERS, known_columns=mindformers.KNOWN_COLUMNS, known_pattern=mindformers.KNOWN_PATTERN,
    nan_grad_norm_unreported=True, anchor="`{ step:[` / `{ Epoch:[` / `Epoch:[..], loss:`",
    whole_line_ends=("]", "T", "}", "|"),
)
NEMO = LogFormatSpec(
    name="nemo", label="NeMo 2", title="NeMo 2 / Lightning ProgressPrinter", is_step_line=nemo.is_step_line,
    parse_step=nemo.parse_step, rules=(), markers=(), known_columns=nemo.KNOWN_COLUMNS, loss_columns=("lm_loss",),
    anchor="`Training epoch E, iteration N/M |`",
)
MEGATRON = LogFormatSpec(
    name="megatron", label="Megatron", title="Megatron-LM / Megatron-DeepSpeed / ms-swift training_log",
    is_step_line=megatron.may_be_step_line, parse_step=megatron.parse_step, rules=megatron.RULES,
    markers=megatron.MARKERS, known_columns=megatron.KNOWN_COLUMNS, known_pattern=megatron.KNOWN_PATTERN,
    loss_columns=("lm_loss", "loss"), skip_column="skipped", continues=megatron.continues,
    anchor="`iteration N/M |`", averages_first_interval=True,
)
FORMATS: dict[str, LogFormatSpec] = {}
"""The registry, by name, in the order `parse_log` tries the entries on a line."""
RESERVED = ("auto", "declared")  # `parse_log`'s choice to detect; a `command` side's regex (alignflow.logs.declared)


def register(spec: LogFormatSpec) -> LogFormatSpec:
    """Add `spec` to the registry (after the entries there: a more specific anchor is registered first)."""
    if spec.name in FORMATS or spec.name in RESERVED:
        raise ValueError(f"log format {spec.name!r} is already registered or reserved")
    FORMATS[spec.name] = spec
    return spec


for _spec in (MINDFORMERS, NEMO, MEGATRON):
    register(_spec)


def names() -> tuple[str, ...]:
    """The registered formats' names: what a user may name a log format."""
    return tuple(FORMATS)


def check_name(name: str) -> str:
    """`name` if a format of that name is registered; `ValueError` naming the registered ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown log format {name!r}; registered: {', '.join(FORMATS)}")
    return name


def all_rules() -> tuple[LineRule, ...]:
    return tuple(rule for spec in FORMATS.values() for rule in spec.rules)


def all_markers() -> tuple[Marker, ...]:
    return tuple(marker for spec in FORMATS.values() for marker in spec.markers)


def known_requirements() -> tuple[str, ...]:
    """Names a caller may require of a run (`check_sentinels(require=...)`, `--require`): every marker."""
    return tuple(sorted({m.name for m in all_markers()}))
