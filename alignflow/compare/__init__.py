"""Comparison of two training logs: statistics, acceptance criteria, verdict, report.

```
compare(test, reference, criteria, *, lr_step_tolerance=1, perf_warmup_steps=10) -> Comparison    pure
write_report(comparison, out_dir, *, title, labels=("test", "reference"), fingerprints=None, plots=True)
    -> ReportFiles(html, markdown, csv, pngs)                                                       writes files
```
Exports are loaded lazily: the experiment config imports `alignflow.compare.criteria`, and that must not pull
pandas and matplotlib into every `alignflow` command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alignflow.compare.comparison import Comparison, CriterionResult, MetricComparison, StepCoverage, compare
    from alignflow.compare.criteria import Criterion, default_criteria
    from alignflow.compare.performance import Performance, SidePerformance
    from alignflow.compare.report import ReportFiles, write_report

_EXPORTS = {
    "Comparison": "comparison", "CriterionResult": "comparison", "MetricComparison": "comparison",
    "StepCoverage": "comparison", "compare": "comparison", "Criterion": "criteria", "default_criteria": "criteria",
    "Performance": "performance", "SidePerformance": "performance", "ReportFiles": "report",
    "write_report": "report",
}

__all__ = [
    "Comparison", "Criterion", "CriterionResult", "MetricComparison", "Performance", "ReportFiles",
    "SidePerformance", "StepCoverage", "compare", "default_criteria", "write_report",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'alignflow.compare' has no attribute {name!r}")
    return getattr(importlib.import_module(f"alignflow.compare.{module}"), name)
