"""Benchmark of the twin: seconds per training step of each side on the default config (twin-moe).

    python benchmarks/bench_twin.py [--steps N] [--eager-steps M] [--sides all|mindspore|torch] [--workdir DIR]

Runs each side through its real entry point in a child process, from scratch, on the same data file:

  mindspore        `python -m alignflow.twin.mindspore_train` (PyNative, step compiled with mindspore.jit)
  mindspore-eager  the same with `twin.jit: false` (plain PyNative: the baseline the jit is measured against)
  torch            `python -m alignflow.twin.torch_train` (CUDA when present, else CPU)

and prints, from the logs the twin writes (parsed with `alignflow.logs.parse_log`), the median step time over
steps 3..N (step 1 includes the jit compilation and step 2 warms up), the time to the first step line, and the
process wall time. Ratios are between sides measured in this same run (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from alignflow.backends.twin import megatron_args  # noqa: E402
from alignflow.config.model import TrainingConfig  # noqa: E402
from alignflow.logs import parse_log  # noqa: E402
from alignflow.twin.data import make_data  # noqa: E402
from alignflow.twin.presets import preset  # noqa: E402
from alignflow.twin.render import mindformers_config, twin_env  # noqa: E402


def _run(argv: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> tuple[list[str], float]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "GLOG_v": "3", "LOCAL_DEFAULT_PATH": str(cwd / "output"),
           **(extra_env or {})}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout.splitlines(keepends=True), wall


def _figures(lines: list[str], wall: float) -> dict[str, float]:
    frame = parse_log(lines).frame
    times = frame["step_time_ms"].astype(float)
    steady = times.loc[3:] if len(times) > 2 else times
    return {"median_s": statistics.median(steady) / 1000.0, "first_s": float(times.iloc[0]) / 1000.0,
            "wall_s": wall, "steps": float(len(frame)), "last_loss": float(frame["lm_loss"].iloc[-1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per side (jit and torch)")
    parser.add_argument("--eager-steps", type=int, default=6, help="steps of the plain-PyNative baseline")
    parser.add_argument("--sides", default="all", choices=["all", "mindspore", "torch"],
                        help="torch alone runs where MindSpore is not installed (e.g. a CUDA host)")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="do not delete the temporary directory")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-twin-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = work / "data" / "data"  # an indexed dataset prefix: data.bin + data.idx
        sha = make_data(data, 65_536, seed=7)
        model = preset("twin-moe")
        results: dict[str, dict[str, float]] = {}
        runs = (("mindspore", args.steps, True), ("mindspore-eager", args.eager_steps, False))
        for name, steps, jit in runs if args.sides in ("all", "mindspore") else ():
            training = TrainingConfig(seed=1234, steps=steps, lr=1e-3, lr_warmup_iters=3, micro_batch_size=4,
                                      global_batch_size=4, bf16=False)
            cfg: dict[str, Any] = mindformers_config(model, training, data_path=str(data), data_sha256=sha,
                                                     load_path=None, save_path=None, steps=steps, jit=jit)
            (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
            lines, wall = _run([sys.executable, "-m", "alignflow.twin.mindspore_train", "--config",
                                str(work / f"{name}.yaml"), "--mode", "1"], work)
            results[name] = _figures(lines, wall)
        if args.sides in ("all", "torch"):
            training = TrainingConfig(seed=1234, steps=args.steps, lr=1e-3, lr_warmup_iters=3, micro_batch_size=4,
                                      global_batch_size=4, bf16=False)
            argv = megatron_args(model, training, data_path=str(data), load=None, save=None, steps=args.steps)
            env = twin_env(data_sha256=sha, megatron_version="0.16")
            lines, wall = _run([sys.executable, "-m", "alignflow.twin.torch_train", *argv], work, env)
            results["torch"] = _figures(lines, wall)
        import torch

        device = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cpu"
        print(f"twin, twin-moe, GBS 4 x seq 32, torch on {device}, {os.cpu_count()} CPUs")
        print(f"{'side':16} {'s/step (median)':>16} {'step 1 s':>9} {'wall s':>7} {'steps':>5} {'last lm loss':>12}")
        for name, r in results.items():
            print(f"{name:16} {r['median_s']:16.4f} {r['first_s']:9.2f} {r['wall_s']:7.1f} {int(r['steps']):5d} "
                  f"{r['last_loss']:12.6f}")
        if args.sides == "all":
            ms, eager, pt = results["mindspore"], results["mindspore-eager"], results["torch"]
            print(f"mindspore.jit speed-up over plain PyNative: {eager['median_s'] / ms['median_s']:.1f}x")
            print(f"MindSpore (jit) / PyTorch step time: {ms['median_s'] / pt['median_s']:.2f}")
            demo = 10 * ms["median_s"] + 2 * 30 * ms["median_s"] + 30 * pt["median_s"]
            print(f"training steps of the demo (10 base + 2 x 30 NPU + 30 GPU): {demo:.1f} s plus start-up "
                  f"({ms['wall_s'] - ms['steps'] * ms['median_s']:.1f} s per MindSpore run)")
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
