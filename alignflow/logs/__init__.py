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
"""

from alignflow.logs.formats import FORMAT_NAMES, known_requirements
from alignflow.logs.parse import FormatChoice, parse_log, parse_log_file
from alignflow.logs.schema import (
    BOOKKEEPING_COLUMNS,
    FIRST_INTERVAL_CHOICES,
    FirstInterval,
    FirstIntervalChoice,
    FirstIntervalNote,
    LogFormat,
    ParsedLog,
    Resolution,
    Restart,
    Sentinel,
    column_order,
    is_cross_entropy,
    is_loss,
)
from alignflow.logs.sentinels import CHECKPOINT_LOADED, check_sentinels

__all__ = [
    "BOOKKEEPING_COLUMNS",
    "CHECKPOINT_LOADED",
    "FIRST_INTERVAL_CHOICES",
    "FORMAT_NAMES",
    "FirstInterval",
    "FirstIntervalChoice",
    "FirstIntervalNote",
    "FormatChoice",
    "LogFormat",
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
