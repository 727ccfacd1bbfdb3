"""Parse + compare + report on two real-format logs: 100,000 steps (plots included) and 1,000 steps (no plots).

Goals (issues 6 and 15, on the 2-core development machine): parse + compare of the 100k-step pair < 10 s, of the
1k-step pair < 1 s; the report (and plots) is timed and printed beside it.
The logs are written with the frameworks' own format strings (`alignflow.logs.render`): a MindFormers PyNative
G3 log (MTP, MoE, stdout prefix) against a Megatron log. Baseline measured in the same run: reading the same two
files line by line without parsing (the I/O floor), so the printed ratio says what the parsing itself costs.

    python benchmarks/bench_compare.py [--steps 100000 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alignflow.compare.comparison import compare
from alignflow.compare.report import write_report
from alignflow.config.criteria import default_criteria
from alignflow.logs import parse_log_file
from alignflow.logs.render import megatron_line, mindformers_pynative_line

GOALS_S = {100_000: 10.0, 1_000: 1.0}


def write_logs(directory: Path, steps: int, seed: int = 0) -> tuple[Path, Path]:
    rng = random.Random(seed)
    npu, gpu = directory / f"npu_{steps}.log", directory / f"gpu_{steps}.log"
    with npu.open("w", encoding="utf-8") as fn, gpu.open("w", encoding="utf-8") as fg:
        for s in range(1, steps + 1):
            loss = 2.0 + 9.0 * math.exp(-s / (steps / 5)) + 0.05 * math.sin(s / 7)
            norm = 1.0 + 2.0 * math.exp(-s / (steps / 10)) + 0.1 * math.cos(s / 3)
            lr = 1e-4 * min(1.0, s / 100)
            lb = 1.0 + 0.01 * math.sin(s / 11)
            fn.write(mindformers_pynative_line(
                s, steps, loss=loss + rng.gauss(0, 2e-4), step_time_ms=700 + rng.randint(-20, 20),
                lr=1e-4 * min(1.0, (s + 1) / 100), grad_norm=norm + rng.gauss(0, 2e-3), consumed_samples=8 * s,
                global_batch_size=8, load_balancing_loss=lb + rng.gauss(0, 1e-4),
                mtp_losses=[loss + 0.1 + rng.gauss(0, 2e-4)], throughput_tflops=1.36) + "\n")
            fg.write(megatron_line(
                s, steps, consumed_samples=8 * s, elapsed_ms=650 + rng.uniform(-15, 15), lr=lr, global_batch_size=8,
                losses={"lm loss": loss, "load_balancing_loss": lb, "mtp_1 loss": loss + 0.1}, grad_norm=norm,
                throughput_tflops=120.0) + "\n")
    return npu, gpu


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def read_only(path: Path) -> int:
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        return sum(1 for _ in fh)


def one_round(npu: Path, gpu: Path, out: Path, plots: bool) -> dict[str, float]:
    t_read, _ = timed(lambda: (read_only(npu), read_only(gpu)))
    t_parse, (test, ref) = timed(lambda: (parse_log_file(npu), parse_log_file(gpu)))
    t_compare, result = timed(lambda: compare(test, ref, default_criteria()))
    t_report, files = timed(lambda: write_report(result, out, title="benchmark", labels=("NPU", "GPU"),
                                                 plots=plots))
    assert result.verdict == "pass", result.reasons
    assert result.steps.compared == len(test.frame) == len(ref.frame)
    assert len(files.pngs) == (5 if plots else 0)
    return {"read": t_read, "parse": t_parse, "compare": t_compare, "report": t_report,
            "parse_compare": t_parse + t_compare, "total": t_parse + t_compare + t_report}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, nargs="+", default=[100_000, 1_000])
    parser.add_argument("--repeat", type=int, default=3, help="rounds per size (the median is reported)")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="alignflow-bench-") as tmp:
        root = Path(tmp)
        for steps in args.steps:
            plots = steps >= 10_000  # the two goals: large with plots, small without
            print(f"== {steps} steps: writing two real-format logs ...", flush=True)
            t_write, (npu, gpu) = timed(lambda steps=steps: write_logs(root, steps))  # type: ignore[misc]
            size_mb = (npu.stat().st_size + gpu.stat().st_size) / 1e6
            print(f"   written in {t_write:.1f} s ({size_mb:.1f} MB); measuring {args.repeat} round(s)", flush=True)
            rounds = []
            for i in range(args.repeat):
                rounds.append(one_round(npu, gpu, root / f"report_{steps}_{i}", plots))
                print(f"   round {i + 1}: total {rounds[-1]['total']:.3f} s", flush=True)
            med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            goal = GOALS_S.get(steps)
            lines = 2 * steps
            print(f"   read only (baseline) {med['read']:.3f} s | parse {med['parse']:.3f} s "
                  f"({med['parse'] / med['read']:.1f}x the read, {lines / med['parse'] / 1e3:.0f}k lines/s) | "
                  f"compare {med['compare']:.3f} s | report{' + plots' if plots else ''} {med['report']:.3f} s")
            verdict = ""
            if goal is not None:
                ok = med["parse_compare"] < goal
                failed = failed or not ok
                verdict = f" (goal < {goal:g} s: {'met' if ok else 'MISSED'}, {med['parse_compare'] / goal:.2f} of it)"
            print(f"   parse + compare: {med['parse_compare']:.3f} s median{verdict}; with the report: "
                  f"{med['total']:.3f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
