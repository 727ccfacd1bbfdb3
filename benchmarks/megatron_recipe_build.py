"""Walk a shipped experiment's Megatron command line through the megatron-core of a real GPU box, TE included.

    python benchmarks/megatron_recipe_build.py EXPERIMENT --megatron-lm CHECKOUT [--device cuda] [--checkpoint DIR]

The CPU checks of CI (`tests/recipes/test_megatron_core.py`) stop Transformer Engine command lines at the `spec`
level: TE cannot exist on a CPU. On a GPU host with TE, this runs the same levels (`alignflow.frameworks.
megatron_build`) with the real TE and the Megatron-LM checkout `pretrain_gpt.py` would use: the real config, the
real TE layer specs, the real `GPTModel` built on the GPU, and — with `--checkpoint`, a directory
`alignflow convert megatron ... --flavor te --megatron-version X.Y` wrote — the strict load of every tensor. It
prints the one-line JSON result and exits 1 unless the deepest level asked for was reached.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--megatron-lm", type=Path, required=True, help="the Megatron-LM checkout gpu.entry lives in")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--checkpoint", type=Path, help="a converted Megatron checkpoint of the experiment's model")
    args = ap.parse_args()
    from alignflow.backends.commands import step_command
    from alignflow.config import load_experiment
    from alignflow.preflight.sides import _megatron_flags

    exp = load_experiment(args.experiment)
    flags = list(_megatron_flags(exp, step_command(exp, "gpu_train", data_sha256="").template.argv))
    case = {"name": exp.name, "argv": flags, "checkpoint": str(args.checkpoint) if args.checkpoint else None}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.megatron_lm.resolve()), str(REPO),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "alignflow.frameworks.megatron_build", "--device", args.device],
                          input=json.dumps([case]), capture_output=True, text=True, env=env, timeout=1800)
    sys.stderr.write(done.stderr[-4000:])
    if done.returncode != 0:
        return 1
    result = json.loads(done.stdout.strip().splitlines()[-1])
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0 if result["reached"] == ("load" if args.checkpoint else "model") else 1


if __name__ == "__main__":
    raise SystemExit(main())
