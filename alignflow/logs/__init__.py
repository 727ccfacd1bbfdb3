"""Training-log parsing: MindFormers and Megatron-LM step lines -> one canonical frame, plus sentinels.

```
parse_log(lines, *, fmt="auto", rank=None, source="", first_interval="auto") -> ParsedLog   pure: lines in, data out
parse_log_file(path, **kw) -> ParsedLog                                 LogParseError if unreadable / no steps
check_sentinels(parsed, *, require=()) -> None                          SentinelError listing each fatal line
```
`ParsedLog.frame` is indexed by step; columns are canonical (`lm_loss`, `mtp_1_loss`, ..., `load_balancing_loss`,
other aux losses, `total_loss`, `grad_norm`, `lr`, `step_time_ms`, `consumed_samples`, `skipped`,
`nan_iterations`, ...). `ParsedLog.resolution` keeps each column's printed resolution. For Megatron logs,
`ParsedLog.first_interval` says which steps were de-averaged from megatron-core >= 0.16's first printed interval
(`first_interval="auto" | "deaverage" | "raw"`; `alignflow.logs.first_interval`).
Exports are loaded lazily, so that importing the package (or its pandas-free modules: `schema`, `sentinels`,
`formats`) does not pull pandas: a fully cached `alignflow run` parses no log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alignflow.lazy import lazy_exports

if TYPE_CHECKING:
    from alignflow.logs.formats import FORMATS, known_requirements
    from alignflow.logs.parse import FormatChoice, parse_log, parse_log_file
    from alignflow.logs.schema import (
        BOOKKEEPING_COLUMNS,
        FIRST_INTERVAL_CHOICES,
        FirstInterval,
        FirstIntervalChoice,
        FirstIntervalNote,
        ParsedLog,
        Resolution,
        Restart,
        Sentinel,
        column_order,
        is_cross_entropy,
        is_loss,
    )
    from alignflow.logs.sentinels import CHECKPOINT_LOADED, check_sentinels

_EXPORTS = {
    "FORMATS": "formats", "known_requirements": "formats",
    "FormatChoice": "parse", "parse_log": "parse", "parse_log_file": "parse",
    "BOOKKEEPING_COLUMNS": "schema", "FIRST_INTERVAL_CHOICES": "schema", "FirstInterval": "schema",
    "FirstIntervalChoice": "schema", "FirstIntervalNote": "schema", "ParsedLog": "schema",
    "Resolution": "schema", "Restart": "schema", "Sentinel": "schema", "column_order": "schema",
    "is_cross_entropy": "schema", "is_loss": "schema",
    "CHECKPOINT_LOADED": "sentinels", "check_sentinels": "sentinels",
}

__all__ = [
    "BOOKKEEPING_COLUMNS",
    "CHECKPOINT_LOADED",
    "FIRST_INTERVAL_CHOICES",
    "FORMATS",
    "FirstInterval",
    "FirstIntervalChoice",
    "FirstIntervalNote",
    "FormatChoice",
    "ParsedLog",
    "Resolution",
    "Restart",
    "Sentinel",
    "check_sentinels",
    "column_order",
    "is_cross_entropy",
    "is_loss",
    "known_requirements",
    "parse_log",
    "parse_log_file",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)
