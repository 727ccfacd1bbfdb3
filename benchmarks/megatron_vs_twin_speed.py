"""Time per iteration of real Megatron-LM against the PyTorch twin, from two logs of the same training.

    python benchmarks/megatron_vs_twin_speed.py MEGATRON_LOG TWIN_LOG [--skip 2] [--json]

Both logs are `training_log` lines (`elapsed time per iteration (ms)`); the first `--skip` iterations (CUDA
start-up, the first interval's extra work) are left out. Prints each side's median and the ratio
megatron / twin, measured in the same run of both (the twin is the baseline).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

_LINE = re.compile(r" iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+) \|")


def per_iteration_ms(path: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _LINE.search(line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    if not out:
        raise SystemExit(f"{path}: no Megatron iteration lines")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("megatron", type=Path)
    ap.add_argument("twin", type=Path)
    ap.add_argument("--skip", type=int, default=2, help="leading iterations left out (default 2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sides = {name: per_iteration_ms(p) for name, p in (("megatron", args.megatron), ("twin", args.twin))}
    med = {name: statistics.median(v for it, v in ms.items() if it > args.skip) for name, ms in sides.items()}
    report = {"megatron_ms_per_iter": med["megatron"], "twin_ms_per_iter": med["twin"],
              "ratio_megatron_over_twin": med["megatron"] / med["twin"],
              "iterations": {name: len(ms) for name, ms in sides.items()}, "skipped": args.skip}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"megatron {med['megatron']:.1f} ms/iter, twin {med['twin']:.1f} ms/iter (medians after iteration "
              f"{args.skip}); megatron / twin = {report['ratio_megatron_over_twin']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
