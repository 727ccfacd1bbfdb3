"""Time and size of the report (issue 20): `write_report` for a 30-step and a 100,000-step comparison.

What is measured per size: the whole `write_report` (interactive HTML with plotly.js inlined, markdown, CSV, JSON
and the PNGs), the HTML page alone, the PNGs alone, and the size of `report.html`. Baseline measured in the same
run: writing the aligned CSV alone (one `%`-format per row, the cheapest full pass over every step), so the
printed ratios say what the page and the figures cost on top of touching every step once.

    python benchmarks/bench_report.py [--steps 30 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compare import timed, write_logs

from alignflow.compare.comparison import compare
from alignflow.compare.plots import metric_pngs
from alignflow.compare.report import aligned_csv, html_report, write_report
from alignflow.config.criteria import default_criteria
from alignflow.logs import parse_log_file


def measure(result: Any, out: Path, repeat: int) -> tuple[dict[str, list[float]], int]:
    """Median-ready timings of each part, and the size of the last report.html."""
    rows: dict[str, list[float]] = {"csv (baseline)": [], "html": [], "pngs": [], "write_report": []}
    size = 0
    for i in range(repeat):
        rows["csv (baseline)"].append(timed(lambda: aligned_csv(result.aligned))[0])
        rows["html"].append(timed(lambda: html_report(result, title="bench", labels=("NPU", "GPU")))[0])
        rows["pngs"].append(timed(lambda: metric_pngs([result], labels=("NPU", "GPU")))[0])
        t, files = timed(lambda i=i: write_report(result, out / str(i), title="bench", labels=("NPU", "GPU")))
        rows["write_report"].append(t)
        size = files.html.stat().st_size
    return rows, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[30, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_report(compare(*(parse_log_file(p) for p in write_logs(root, 30)), default_criteria()),
                     root / "warm", labels=("NPU", "GPU"))  # imports (plotly, matplotlib, jinja2) out of the figures
        for steps in args.steps:
            npu, gpu = write_logs(root, steps)
            result = compare(parse_log_file(npu), parse_log_file(gpu), default_criteria())
            rows, size = measure(result, root / f"r{steps}", args.repeat)
            base = statistics.median(rows["csv (baseline)"])
            print(f"{steps} steps: report.html {size} bytes")
            for name, values in rows.items():
                med = statistics.median(values)
                print(f"  {name:15s} {med:8.3f} s  ({med / base:8.1f}x the CSV baseline)")
    return 0


if __name__ == "__main__":
    start = time.perf_counter()
    rc = main()
    print(f"(total {time.perf_counter() - start:.1f} s)")
    sys.exit(rc)
