"""Benchmark: an 8-way sharded MindFormers checkpoint of > 2 GiB converted to Megatron torch_dist, beside a plain
safetensors load + torch.save of the same tensors, and the fingerprint of the result beside openssl.

    python benchmarks/bench_dist_convert.py [--workdir DIR] [--layers 12] [--repeat 2] [--keep]

The checkpoint is MindFormers' PyNative multi-rank layout (8 `checkpoint-model-000000r-0000008.safetensors`, each
rank holding an eighth of every tensor's rows, and `metadata.json` naming the chunks), bf16, of a dense GPT of
megatron-core's local spec: 12 layers, hidden 2048, SwiGLU 5632, 16 heads / 4 groups, vocabulary 131072, untied
output (1.08 B parameters, 2.16 GB; the largest tensors are the embedding and the output layer, 512 MiB each). It is
written under `--workdir` (default: the system's temporary directory) and removed at the end.

Measured in the same run, each conversion phase in a fresh child process, `--repeat` rounds taking turns (best of
each); the hashing in this process, as `bench_fingerprint.py` measures it:

  convert    `convert_to_megatron(..., ckpt_format="torch_dist")`: merge the ranks' chunks, the spec's ops, write
             through megatron-core's dist_checkpointing with one writer per core; with the model's layout in the
             layout cache (every conversion after the first of a model), the writers start while megatron-core is
             imported and the save planned
  cold       the same with an empty layout cache: writers start after megatron-core's planning
  baseline   for each rank file: `safetensors.torch.load_file` + `torch.save` (+ fsync, as the writers do)
  hash       alignflow's Fingerprinter of the torch_dist directory (files in parallel, every core; no memo)
  openssl    `openssl dgst -sha256` of the same files, one stream

and prints: conversion throughput / baseline's (goal >= 0.7), the converter's peak RSS and its writers' against
2 x the largest tensor + 300 MB (goal: each process within it), hash throughput / openssl's (goal >= 1.6 on 2 cores).
Before each phase the page cache is written back (`os.sync`); inputs are read from the page cache.
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
sys.path.insert(0, str(REPO))

MIB = 2**20
RANKS = 8
ITERATION = 10


def model_config(layers: int) -> dict:
    return {"family": "twin-dense", "num_layers": layers, "hidden_size": 2048, "ffn_hidden_size": 5632,
            "num_attention_heads": 16, "num_query_groups": 4, "kv_channels": 128, "vocab_size": 131072,
            "seq_length": 32, "rotary_base": 10000}


def make_checkpoint(root: Path, layers: int) -> tuple[int, int]:
    """The sharded bf16 checkpoint; (total bytes, largest tensor's bytes)."""
    from alignflow.config.model import ModelConfig
    from alignflow.convert import build_plan, load_spec
    from alignflow.convert.tensor_io import StreamingSafetensorsWriter, TensorMeta

    model = ModelConfig.model_validate(model_config(layers))
    plan = build_plan(load_spec("twin-dense"), model, flavor="local")
    assert not plan.problems, plan.problems
    shapes = [(k, s) for m in plan.mappings for k, s in zip(m.sources, m.source_shapes, strict=True)]
    it_dir = root / f"iteration_{ITERATION:08d}"
    it_dir.mkdir(parents=True)
    meta: dict = {"state_dict_metadata": {}, "storage_data": {}}
    for name, shape in shapes:
        assert shape[0] % RANKS == 0, (name, shape)
        rows = shape[0] // RANKS
        meta["state_dict_metadata"][name] = {
            "properties": {"dtype": "BFloat16", "replica_id": 0}, "global_shape": list(shape),
            "axis_fragmentations": [RANKS, *[1] * (len(shape) - 1)], "layout": None,
            "chunk": [{"global_offset": [r * rows, *[0] * (len(shape) - 1)], "local_shape": [rows, *shape[1:]]}
                      for r in range(RANKS)]}
    g = torch.Generator().manual_seed(0)
    for r in range(RANKS):
        file = f"checkpoint-model-{r:07d}-{RANKS:07d}.safetensors"
        layout = [(n, TensorMeta((s[0] // RANKS, *s[1:]), torch.bfloat16)) for n, s in shapes]
        with StreamingSafetensorsWriter(it_dir / file, layout, {"format": "ms"}) as w:
            for name, m in layout:
                w.write(name, (torch.randn(m.shape, generator=g) * 0.02).to(torch.bfloat16))
                offset = (r * m.shape[0], *[0] * (len(m.shape) - 1))
                meta["storage_data"][str((name, offset))] = [{"file_name": file, "storage_rank": r}]
    (it_dir / "metadata.json").write_text(json.dumps(meta, separators=(",", ":")))
    (it_dir / "common.json").write_text(json.dumps({"epoch_num": 0, "step_num": ITERATION, "global_step": ITERATION,
                                                    "loss_scale": 1.0, "global_batch_size": 1,
                                                    "consumed_samples": 0, "ckpt_status": None}))
    (root / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    total = sum(TensorMeta(s, torch.bfloat16).nbytes for _, s in shapes)
    largest = max(TensorMeta(s, torch.bfloat16).nbytes for _, s in shapes)
    return total, largest


# --- phases, each run in a child process: `python bench_dist_convert.py --phase NAME SRC DST LAYERS` -------------

def phase_convert(src: Path, dst: Path, layers: int) -> dict:
    from alignflow.config.model import ModelConfig
    from alignflow.convert import convert_to_megatron

    start = time.perf_counter()
    summary = convert_to_megatron(src, dst, spec="twin-dense", model=ModelConfig.model_validate(model_config(layers)),
                                  ckpt_format="torch_dist")
    return {"seconds": time.perf_counter() - start, "files": len(summary.output_files)}


def phase_baseline(src: Path, dst: Path, layers: int) -> dict:
    from safetensors.torch import load_file

    start = time.perf_counter()
    dst.mkdir()
    for file in sorted((src / f"iteration_{ITERATION:08d}").glob("*-model-*.safetensors")):
        tensors = load_file(str(file))
        with open(dst / f"{file.stem}.pt", "wb") as fh:
            torch.save(tensors, fh)
            fh.flush()
            os.fsync(fh.fileno())
        del tensors
    return {"seconds": time.perf_counter() - start}


PHASES = {"convert": phase_convert, "baseline": phase_baseline}


def _child(phase: str, src: Path, dst: Path, layers: int, cache: Path) -> dict:
    os.sync()
    if phase == "cold":
        shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "ALIGNFLOW_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, __file__, "--phase", "convert" if phase == "cold" else phase, str(src),
                           str(dst), str(layers)], capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _warm(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb", buffering=0) as fh:
                while fh.read(64 * MIB):
                    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--phase", nargs=4, metavar=("NAME", "SRC", "DST", "LAYERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        name, src, dst, layers = args.phase
        result = PHASES[name](Path(src), Path(dst), int(layers))
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        result["maxrss_mib"] = me.ru_maxrss / 1024
        result["children_maxrss_mib"] = kids.ru_maxrss / 1024
        result["cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        print(json.dumps(result))
        return 0
    root = Path(tempfile.mkdtemp(prefix="bench-dist-", dir=args.workdir))
    try:
        start = time.perf_counter()
        total, largest = make_checkpoint(root / "src", args.layers)
        print(f"input: {RANKS} rank files, {total / 1e9:.2f} GB bf16 ({total / 2**30:.2f} GiB), largest tensor "
              f"{largest / MIB:.0f} MiB; written in {time.perf_counter() - start:.0f} s; {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f}")
        _warm(root / "src")
        best: dict[str, dict] = {}
        rounds = [("cold", "td"), ("convert", "td"), ("baseline", "base")]
        for i in range(args.repeat):
            for phase, dst in rounds if i % 2 == 0 else rounds[::-1][1:] + rounds[::-1][:1]:
                shutil.rmtree(root / dst, ignore_errors=True)
                _warm(root / "src")
                r = _child(phase, root / "src", root / dst, args.layers, root / f"cache-{phase}")
                if phase not in best or r["seconds"] < best[phase]["seconds"]:
                    best[phase] = r
        # hashing as benchmarks/bench_fingerprint.py measures it: in this process, from the page cache, taking turns
        from alignflow.fingerprint import Fingerprinter
        from benchmarks.bench_fingerprint import _best_interleaved

        files = sorted(str(p) for p in (root / "td").rglob("*") if p.is_file())
        _warm(root / "td")
        cores = len(os.sched_getaffinity(0))
        timed = _best_interleaved(max(args.repeat, 3), {
            "openssl": lambda: subprocess.run(["openssl", "dgst", "-sha256", *files], check=True,
                                              stdout=subprocess.DEVNULL),
            "hash": lambda: Fingerprinter(workers=cores).fingerprint(root / "td")})
        best["openssl"], best["hash"] = ({"seconds": timed[k][0], "cpu": timed[k][1]} for k in ("openssl", "hash"))
        out_bytes = sum(p.stat().st_size for p in (root / "td").rglob("*") if p.is_file())
        conv, cold, base = best["convert"], best["cold"], best["baseline"]
        budget = 2 * largest / MIB + 300
        def row(label: str, r: dict, note: str) -> None:
            print(f"{label:<9} {r['seconds']:7.1f} s  {total / r['seconds'] / 1e6:7.0f} MB/s  {r['cpu_s']:5.1f} "
                  f"CPU-s   {note}")

        row("convert", conv, f"peak RSS: converter {conv['maxrss_mib']:.0f} MiB, largest writer "
                             f"{conv['children_maxrss_mib']:.0f} MiB ({conv['files']} files)")
        row("cold", cold, f"(empty layout cache: ratio {base['seconds'] / cold['seconds']:.2f}x)")
        row("baseline", base, f"peak RSS {base['maxrss_mib']:.0f} MiB (load_file + torch.save per rank file)")
        print(f"  throughput ratio convert / baseline: {base['seconds'] / conv['seconds']:.2f}x (goal >= 0.7x)")
        print(f"  peak RSS per process vs 2 x largest tensor + 300 MB = {budget:.0f} MiB: converter "
              f"{conv['maxrss_mib'] / budget:.2f}, writer {conv['children_maxrss_mib'] / budget:.2f} (goal <= 1)")
        h, o = best["hash"], best["openssl"]
        n_files = len([p for p in (root / "td").rglob("*") if p.is_file()])
        print(f"hash      {h['seconds']:7.2f} s  {out_bytes / h['seconds'] / 1e6:7.0f} MB/s   (alignflow "
              f"Fingerprinter, {n_files} files, {cores} workers; CPU/wall {h['cpu'] / h['seconds']:.2f})")
        print(f"openssl   {o['seconds']:7.2f} s  {out_bytes / o['seconds'] / 1e6:7.0f} MB/s   (openssl dgst -sha256, "
              "one stream)")
        print(f"  hash ratio alignflow / openssl: {o['seconds'] / h['seconds']:.2f}x (goal >= 1.6x)")
        goals = (("convert / baseline", base["seconds"] / conv["seconds"], 0.7),
                 ("converter RSS headroom", budget / conv["maxrss_mib"], 1.0),
                 ("writer RSS headroom", budget / conv["children_maxrss_mib"], 1.0),
                 ("hash / openssl", o["seconds"] / h["seconds"], 1.6))
        missed = [name for name, value, goal in goals if value < goal]
        verdict = f"MISSED: {', '.join(missed)}" if missed else "all goals met"
        print(f"load average {os.getloadavg()[0]:.1f}; {verdict}")
        return 1 if missed else 0  # `make bench` stops on a missed goal
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}")


if __name__ == "__main__":
    sys.exit(main())
