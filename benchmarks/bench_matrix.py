"""The matrix report from logs: seed 004's 11 variants x 500 steps, both sides, against the pair comparison.

Goals (issue 37, on the 2-core development machine):

- the matrix report of 11 variants x 500 steps (both sides: 24 logs read from files, parsed, every variant
  compared with the reference, tables, bar charts, matrix.json written) in < 3 s;
- parse + compare of each variant at the speed of today's pair comparison: the baseline, measured in the same
  run, is what a user did before matrices — `parse_log_file` of both logs and `compare` for each of the 22 pairs
  (11 variants x 2 sides, the reference parsed again for each). The matrix's overhead per variant beyond that must
  stay under 50 ms.

The logs are written with the frameworks' own format strings (`alignflow.logs.render`): MindFormers PyNative G3
lines with MindSpore's memory statistics on the NPU side, Megatron `training_log` lines with `report_memory` for
8 ranks on the GPU side.

    python benchmarks/bench_matrix.py [--variants 11] [--steps 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alignflow.compare.comparison import compare
from alignflow.config.criteria import Criterion
from alignflow.config.variants import Matrix
from alignflow.logs import parse_log_file
from alignflow.logs.render import megatron_line, mindformers_pynative_line
from alignflow.matrix.compare import ConfigTrainings, SideTraining, compare_matrix
from alignflow.matrix.memory import parse_memory
from alignflow.matrix.report import write_matrix_report
from alignflow.matrix.status import TrainingStatus

GOAL_REPORT_S = 3.0
GOAL_OVERHEAD_MS = 50.0
CRITERIA = [Criterion(metric="lm_loss", statistic="mean_rel", threshold="0.001%"),
            Criterion(metric="lm_loss", statistic="max_rel", threshold="0.01%"),
            Criterion(metric="mtp_1_loss", statistic="mean_rel", threshold="0.001%")]


def names(variants: int) -> list[str]:
    return [f"{i:02d}_switch" for i in range(1, variants + 1)]


def write_logs(directory: Path, variants: int, steps: int) -> dict[str, dict[str, Path]]:
    """reference + variants, each an NPU and a GPU log (variant i: ms/iter and memory change, its loss by 1e-7 i)."""
    out: dict[str, dict[str, Path]] = {}
    for i, name in enumerate(["00_baseline", *names(variants)]):
        npu, gpu = directory / f"{name}_npu.log", directory / f"{name}_gpu.log"
        with npu.open("w", encoding="utf-8") as fn, gpu.open("w", encoding="utf-8") as fg:
            fn.write("All Network parameters are loaded.\n")
            fg.write(" successfully loaded checkpoint from /x [ t 1/1, p 1/1 ] at iteration 0\n")
            for s in range(1, steps + 1):
                loss = (2.0 + 9.0 * math.exp(-s / (steps / 5)) + 0.05 * math.sin(s / 7)) * (1 + 1e-7 * i)
                fn.write(mindformers_pynative_line(
                    s, steps, loss=loss, step_time_ms=160 + 5 * i, lr=1e-5, grad_norm=1.5, consumed_samples=8 * s,
                    global_batch_size=8, mtp_losses=[loss + 0.1]) + "\n")
                fg.write(megatron_line(
                    s, steps, consumed_samples=8 * s, elapsed_ms=161.9 + 4 * i, lr=1e-5, global_batch_size=8,
                    losses={"lm loss": loss, "mtp_1 loss": loss + 0.1}, grad_norm=1.5, microseconds=False) + "\n")
                if s == 1:
                    fg.writelines(f"[Rank {r}] (after 1 iterations) memory (MB) | allocated: 400.0 | max allocated: "
                                  f"{729.5 - 10 * i + r:.2f} | reserved: 800.0 | max reserved: 800.0\n"
                                  for r in range(8))
            fn.write(f"Used peak memory usage (without fragments): {730 - 10 * i}M\n"
                     f"Actual peak memory usage (with fragments): {740 - 10 * i}M\n")
        out[name] = {"npu": npu, "gpu": gpu}
    return out


def matrix_report(logs: dict[str, dict[str, Path]], variants: int, out: Path, *, charts: bool) -> Any:
    """What a matrix run does once its trainings are done: read, parse, compare, write."""
    trainings = {}
    for name, sides in logs.items():
        trained = {}
        for side, path in sides.items():
            lines = path.read_text(encoding="utf-8").splitlines()
            trained[side] = SideTraining(TrainingStatus("completed", 0), parse_log_file(path),
                                         parse_memory(lines), identity=f"{name}:{side}")
        trainings[name] = ConfigTrainings(name, trained)
    matrix = Matrix.model_validate({"reference": "00_baseline", "warmup_steps": 100,
                                    "configs": {n: {"patch": {}} for n in names(variants)}})
    result = compare_matrix(matrix, {"default": trainings}, criteria=CRITERIA, experiment="bench")
    write_matrix_report(result, out, charts=charts)
    return result


def pairs(logs: dict[str, dict[str, Path]]) -> None:
    """Today's way: each variant's log against the reference's, parsed and compared, one pair at a time."""
    for name, sides in logs.items():
        if name == "00_baseline":
            continue
        for side, path in sides.items():
            compare(parse_log_file(path), parse_log_file(logs["00_baseline"][side]), CRITERIA, perf_warmup_steps=100)


def best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) if repeat > 1 else statistics.mean(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", type=int, default=11)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        root = Path(tmp)
        logs = write_logs(root, args.variants, args.steps)
        matrix_report(logs, args.variants, root / "warm", charts=True)  # imports (pandas, matplotlib) once
        result = matrix_report(logs, args.variants, root / "check", charts=False)
        if result.verdict != "pass" or len(result.rows) != 2 * args.variants:
            raise SystemExit(f"the benchmark's matrix is wrong: {result.verdict}, {len(result.rows)} rows, "
                             f"{result.reasons}")
        report = best(lambda: matrix_report(logs, args.variants, root / "r", charts=True), args.repeat)
        compare_only = best(lambda: matrix_report(logs, args.variants, root / "c", charts=False), args.repeat)
        baseline = best(lambda: pairs(logs), args.repeat)
    n = args.variants
    overhead_ms = (compare_only - baseline) / n * 1000
    print(f"matrix of {n} variants x {args.steps} steps, both sides ({2 * (n + 1)} logs), best of {args.repeat}:")
    print(f"  report (read, parse, compare, tables, 2 charts, json): {report:.2f} s  "
          f"goal < {GOAL_REPORT_S:.0f} s  ratio {report / GOAL_REPORT_S:.2f}")
    print(f"  parse + compare, matrix: {compare_only:.2f} s; the {2 * n} pairs one at a time (baseline): "
          f"{baseline:.2f} s; ratio {compare_only / baseline:.2f}")
    print(f"  overhead per variant: {overhead_ms:+.1f} ms  goal < {GOAL_OVERHEAD_MS:.0f} ms")
    ok = report < GOAL_REPORT_S and overhead_ms < GOAL_OVERHEAD_MS
    print("PASS" if ok else "ABOVE GOAL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
