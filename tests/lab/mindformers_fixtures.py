"""Write the real-MindFormers-2.1.0 fixtures of tests/data/mindformers_2.1.0/ from CPU-lab runs.

    python -m tests.lab.mindformers_fixtures RUN_DIR OUT_DIR

RUN_DIR holds what the lab wrote (`python -m alignflow.labs.mindformers_cpu.launcher --config X`): the logs
`train.log` (3 steps, saving), `resume.log` (full resume to step 5), `reload.log` (weights only),
`missing_checkpoint.log` (load_path absent), `missing_parameter.log` (a checkpoint without output_layer) and the
checkpoint directory `ckpt/`. Logs are trimmed to the lines the tests read (step lines, checkpoint load/save
lines) and the run directory is replaced by `/data/run01`; the checkpoint becomes `layout.json` (file names,
tracker, each safetensors header: tensor names, dtypes, shapes, metadata) and `common.json` (verbatim).
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

KEEP = ("loss_callback.py:337", "checkpoint.py:", "checkpoint_callback.py:", "Resume dataset", "Start training loop",
        "Skipping checkpoint loading", "utils.py:699")


def _trim(text: str, run_dir: str) -> str:
    lines = [line.replace(run_dir, "/data/run01") for line in text.splitlines()
             if any(k in line for k in KEEP) and " - mindformers" in line]
    return "\n".join(lines) + "\n"


def _header(path: Path) -> dict[str, object]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    meta = header.pop("__metadata__", None)
    return {"metadata": meta, "tensors": {k: {"dtype": v["dtype"], "shape": v["shape"]}
                                          for k, v in sorted(header.items())}}


def main(run_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("train", "resume", "reload", "missing_checkpoint", "missing_parameter"):
        (out / f"{name}.log").write_text(_trim((run_dir / f"{name}.log").read_text(), str(run_dir)))
    ckpt = run_dir / "ckpt"
    iteration = (ckpt / "latest_checkpointed_iteration.txt").read_text()
    it_dir = ckpt / f"iteration_{int(iteration):08d}"
    layout = {"tracker": iteration, "iteration_dir": it_dir.name, "files": sorted(p.name for p in it_dir.iterdir()),
              "safetensors": {p.name: _header(p) for p in sorted(it_dir.glob("*.safetensors"))}}
    (out / "layout.json").write_text(json.dumps(layout, indent=1) + "\n")
    (out / "common.json").write_bytes((it_dir / "common.json").read_bytes())


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
