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

from typing import TYPE_CHECKING

from alignflow.lazy import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)
