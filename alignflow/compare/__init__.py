"""Comparison of two training logs: statistics, acceptance criteria, verdict, report.

```
compare(test, reference, criteria, *, lr_step_tolerance=1, perf_warmup_steps=10, require=(), min_overlap=None)
    -> Comparison                                                                                   pure
write_report(comparison | [comparisons], out_dir, *, title, labels=(tests..., reference), fingerprints=None,
             plots=True, context=ReportContext | None) -> ReportFiles(html, markdown, csv, json, pngs)  writes files
```
Exports are loaded lazily, so that importing the package pulls neither pandas nor matplotlib. The criteria are
the experiment config's (`alignflow.config.criteria`), re-exported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alignflow.compare.comparison import Comparison, CriterionResult, MetricComparison, StepCoverage, compare
    from alignflow.compare.context import FingerprintRow, ReportContext, StepRow
    from alignflow.compare.performance import Performance, SidePerformance
    from alignflow.compare.report import ReportFiles, write_report
    from alignflow.config.criteria import Criterion, default_criteria

_EXPORTS = {
    "Comparison": "comparison", "CriterionResult": "comparison", "MetricComparison": "comparison",
    "StepCoverage": "comparison", "compare": "comparison", "Criterion": "alignflow.config.criteria",
    "default_criteria": "alignflow.config.criteria",
    "Performance": "performance", "SidePerformance": "performance", "ReportFiles": "report",
    "write_report": "report", "ReportContext": "context", "StepRow": "context", "FingerprintRow": "context",
}

__all__ = [
    "Comparison", "Criterion", "CriterionResult", "FingerprintRow", "MetricComparison", "Performance",
    "ReportContext", "ReportFiles", "SidePerformance", "StepCoverage", "StepRow", "compare", "default_criteria",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'alignflow.compare' has no attribute {name!r}")
    return getattr(importlib.import_module(module if "." in module else f"alignflow.compare.{module}"), name)
