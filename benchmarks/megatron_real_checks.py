"""Check alignflow's Megatron knowledge against real Megatron-LM checkouts (run where `megatron.training` imports:
a GPU host with torch and triton).

    python benchmarks/megatron_real_checks.py CHECKOUT [CHECKOUT ...] [--experiment experiments/demo-megatron.yaml]

For each checkout (a Megatron-LM source tree at one tag), in a fresh interpreter:

1. the committed flag table of its megatron-core version equals the table generated from its `arguments.py`
   (`python -m alignflow.frameworks.megatron_lm table`);
2. the experiment's gpu_train command line, rendered for that version, goes through the real `parse_args` and
   `validate_args` in the step's own environment (what `--deterministic-mode` checks);
3. the real tokenizer built from those arguments (`build_tokenizer`) has the vocabulary, end-of-document id and
   padded vocabulary alignflow derives (`alignflow.frameworks.megatron_versions.null_tokenizer`).

Prints one JSON object per checkout and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROBE = r"""
import json, os, sys, typing, warnings
warnings.simplefilter("ignore")
typing.override = getattr(typing, "override", lambda f: f)
checkout, version, flags, step_env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
sys.path.insert(0, checkout)
os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", **step_env})
from megatron.training.arguments import parse_args, validate_args
sys.argv = ["pretrain_gpt.py", *flags]
out = {}
args = parse_args()
try:
    validate_args(args, {})
    out["validate"] = "ok"
except BaseException as exc:  # what pretrain_gpt.py would stop at
    out["validate"] = f"{type(exc).__name__}: {exc}"
args.rank = getattr(args, "rank", 0) or 0
if tuple(int(x) for x in version.split(".")[:2]) >= (0, 17):
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
else:
    from megatron.training.tokenizer import build_tokenizer
args.padded_vocab_size = None
tok = build_tokenizer(args)
out |= {"vocab_size": int(tok.vocab_size), "eod": int(tok.eod), "padded": int(args.padded_vocab_size)}
print(json.dumps(out))
"""


def checkout_version(checkout: Path) -> str:
    text = (checkout / "megatron" / "core" / "package_info.py").read_text()
    major, minor = (re.search(rf"^{k}\s*=\s*(\d+)", text, re.M).group(1) for k in ("MAJOR", "MINOR"))  # type: ignore[union-attr]
    return f"{major}.{minor}"


def check(checkout: Path, experiment: Path) -> dict[str, object]:
    from alignflow.backends.commands import step_command
    from alignflow.config import load_experiment
    from alignflow.frameworks.megatron_lm import load_table
    from alignflow.frameworks.megatron_versions import null_tokenizer
    from alignflow.preflight.sides import _megatron_flags

    version = checkout_version(checkout)
    result: dict[str, object] = {"checkout": str(checkout), "version": version}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "alignflow.frameworks.megatron_lm", "table", str(checkout)],
                          capture_output=True, text=True, env=env, timeout=600)
    committed = load_table(version)
    if done.returncode != 0:
        result["table"] = f"generator failed: {done.stderr.strip().splitlines()[-1:]}"
    else:
        fresh = json.loads(done.stdout)
        result["table"] = "equal" if committed and committed["arguments"] == fresh["arguments"] else "DIFFERENT"
    exp = load_experiment(experiment)
    exp = exp.model_copy(update={"gpu": exp.gpu.model_copy(update={"megatron_version": version})})
    template = step_command(exp, "gpu_train", data_sha256="").template
    flags = list(_megatron_flags(exp, template.argv))
    done = subprocess.run([sys.executable, "-c", PROBE, str(checkout), version, json.dumps(flags),
                           json.dumps(template.env)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        result["parse"] = "refused: " + " | ".join(done.stderr.strip().splitlines()[-3:])
        return result
    real = json.loads(done.stdout.strip().splitlines()[-1])
    vocab, eod = null_tokenizer(version).vocab_and_eod(*_vocab_flags(flags))
    result |= {"parse": "ok", **real, "alignflow": {"vocab_size": vocab, "eod": eod,
                                                    "padded": exp.model.vocab_size}}
    return result


def _vocab_flags(flags: list[str]) -> tuple[int, int | None]:
    size = int(flags[flags.index("--vocab-size") + 1])
    eod = int(flags[flags.index("--null-tokenizer-eod-id") + 1]) if "--null-tokenizer-eod-id" in flags else None
    return size, eod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkouts", nargs="+", type=Path)
    ap.add_argument("--experiment", type=Path, default=REPO / "experiments" / "demo-megatron.yaml")
    args = ap.parse_args()
    failed = False
    for checkout in args.checkouts:
        r = check(checkout.resolve(), args.experiment)
        ours = r.get("alignflow") or {}
        good = (r.get("table") == "equal" and r.get("parse") == "ok" and r.get("validate") == "ok"
                and all(r.get(k) == v for k, v in ours.items()))  # type: ignore[union-attr]
        failed |= not good
        print(json.dumps({**r, "ok": good}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
