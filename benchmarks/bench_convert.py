"""Benchmark of the checkpoint converters on a GLM-5.2 1B-sized checkpoint (docs/seeds.md#glm-52-1b, spec glm52-1b).

    python benchmarks/bench_convert.py [--workdir DIR] [--keep] [--flavor te|local] [--repeat N]

Writes a synthetic fp32 MindFormers base checkpoint with the glm52-1b shapes (~1.02 B parameters: 4.1 GB fp32,
2.05 GB in bf16; the MLA/DSA shapes are those the spec assumes), then measures, each in a fresh child process:

  bf16       `convert_bf16` of the base checkpoint
  base-bf16  plain `safetensors.torch.load_file` + `save_file` of the same file (the baseline)
  megatron   `convert_to_megatron` of the bf16 checkpoint (spec glm52-1b)
  base-mg    plain load + save of the bf16 file (the baseline)

and prints throughput (input bytes per second) next to its baseline, and peak RSS against the goal of
issue 4: throughput >= 0.7x the baseline's, peak RSS <= 1.5x the largest output file + 300 MB. Before every
phase the page cache is written back (`os.sync`), so that no phase pays for the previous one's dirty pages; all
phases read inputs that are in the page cache. With `--repeat N` the pairs run N times in alternating order and
the fastest run of each phase counts (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
SPEC = "glm52-1b"
MB = 1024 * 1024
OUTPUTS = {"bf16": "bf16", "megatron": "mg", "base-bf16": "base-bf16.safetensors", "base-mg": "base-mg.safetensors"}


def _base_file(root: Path) -> Path:
    return root / "base" / "iteration_00000010" / "glm-model-0000000-0000001.safetensors"


def _bf16_file(root: Path) -> Path:
    return root / "bf16" / "iteration_00000010" / "glm-model-0000000-0000001.safetensors"


def make_checkpoint(root: Path) -> int:
    """The fp32 base checkpoint, written tensor by tensor; returns its size in bytes."""
    from alignflow.convert import build_plan, load_spec
    from alignflow.convert.tensor_io import StreamingSafetensorsWriter, TensorMeta

    plan = build_plan(load_spec(SPEC), flavor="te")
    layout = [(k, TensorMeta(s, torch.float32)) for m in plan.mappings for k, s in zip(m.sources, m.source_shapes,
                                                                                         strict=True)]
    counters = [(k.replace("expert_bias", "tokens_per_expert"), TensorMeta(s.shape, torch.float32))
                for k, s in layout if k.endswith("expert_bias")]
    file = _base_file(root)
    file.parent.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    with StreamingSafetensorsWriter(file, layout + counters) as writer:
        for name, meta in layout + counters:
            writer.write(name, torch.randn(meta.shape, generator=g) * 0.02)
    (file.parent / "common.json").write_text(json.dumps({"epoch_num": 1, "step_num": 10, "global_step": 10,
                                                         "loss_scale": 1.0, "global_batch_size": 8,
                                                         "consumed_samples": 80, "ckpt_status": None}))
    (root / "base" / "latest_checkpointed_iteration.txt").write_text("10")
    return file.stat().st_size


def run_phase(phase: str, root: Path, flavor: str) -> dict[str, float]:
    """One measured step in this process; returns seconds, input bytes, output bytes."""
    from safetensors.torch import load_file, save_file

    from alignflow.convert import convert_bf16, convert_to_megatron

    start = time.perf_counter()
    if phase == "bf16":
        convert_bf16(root / "base", root / "bf16")
        src, out = _base_file(root), _bf16_file(root)
    elif phase == "megatron":
        convert_to_megatron(root / "bf16", root / "mg", spec=SPEC, flavor=flavor)  # type: ignore[arg-type]
        src, out = _bf16_file(root), root / "mg" / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt"
    elif phase in ("base-bf16", "base-mg"):
        src = _base_file(root) if phase == "base-bf16" else _bf16_file(root)
        out = root / f"{phase}.safetensors"
        save_file(load_file(str(src)), str(out))
    else:
        raise SystemExit(f"unknown phase {phase}")
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "in_bytes": src.stat().st_size, "out_bytes": out.stat().st_size,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _child(phase: str, root: Path, flavor: str) -> dict[str, float]:
    previous = root / OUTPUTS[phase]  # a repeat writes the same output again
    if previous.is_dir():
        shutil.rmtree(previous)
    previous.unlink(missing_ok=True)
    os.sync()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, __file__, "--phase", phase, "--workdir", str(root), "--flavor", flavor],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where to write (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints")
    parser.add_argument("--flavor", choices=["te", "local"], default="te")
    parser.add_argument("--repeat", type=int, default=1, help="run every phase N times, keep the fastest")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(run_phase(args.phase, args.workdir, args.flavor)))
        return 0
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench-convert-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        size = make_checkpoint(root)
        print(f"synthetic {SPEC} base checkpoint: {size / MB:,.0f} MiB fp32 in {time.perf_counter() - t0:.1f} s "
              f"({torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs)")
        results: dict[str, dict[str, float]] = {}
        for i in range(args.repeat):
            order = ("base-bf16", "bf16", "base-mg", "megatron") if i % 2 == 0 else ("bf16", "base-bf16", "megatron",
                                                                                       "base-mg")
            for phase in order:
                r = _child(phase, root, args.flavor)
                if phase not in results or r["seconds"] < results[phase]["seconds"]:
                    results[phase] = r
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'step':<10} {'input MiB':>10} {'output MiB':>10} {'seconds':>8} {'MiB/s':>8} {'peak RSS MiB':>13}")
    for phase, r in results.items():
        print(f"{phase:<10} {r['in_bytes'] / MB:>10,.0f} {r['out_bytes'] / MB:>10,.0f} {r['seconds']:>8.2f} "
              f"{r['in_bytes'] / MB / r['seconds']:>8.1f} {r['peak_rss'] / MB:>13,.0f}")
    missed = 0
    for ours, base in (("bf16", "base-bf16"), ("megatron", "base-mg")):
        r, b = results[ours], results[base]
        ratio = (r["in_bytes"] / r["seconds"]) / (b["in_bytes"] / b["seconds"])
        limit = 1.5 * r["out_bytes"] + 300 * MB
        verdict = "met" if ratio >= 0.7 else "MISSED"
        rss_verdict = "met" if r["peak_rss"] <= limit else "MISSED"
        print(f"{ours}: throughput {ratio:.2f}x the plain load+save (goal >= 0.7x: {verdict}); "
              f"peak RSS {r['peak_rss'] / MB:,.0f} MiB vs limit {limit / MB:,.0f} MiB "
              f"(1.5 x {r['out_bytes'] / MB:,.0f} + 300: {rss_verdict}); "
              f"baseline peak RSS {b['peak_rss'] / MB:,.0f} MiB")
        missed += verdict != "met" or rss_verdict != "met"
    return 1 if missed else 0  # `make bench` stops on a missed goal


if __name__ == "__main__":
    sys.exit(main())
