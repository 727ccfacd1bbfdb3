"""Check alignflow's Megatron knowledge against real Megatron-LM checkouts (run where `megatron.training` imports:
torch and triton; a CPU is enough — `python -m alignflow.frameworks.megatron_installs path 0.19.0` prints a
PYTHONPATH with triton in it).

    python benchmarks/megatron_real_checks.py CHECKOUT [CHECKOUT ...] [--experiment FILE ...]

Fetch the checkouts (never commit them), e.g. `git clone https://github.com/NVIDIA/Megatron-LM && git -C
Megatron-LM worktree add ../core_v0.19.0 core_v0.19.0`. For each checkout (a Megatron-LM tree at one tag) and each
experiment (default: every shipped Megatron experiment), in a fresh interpreter:

1. the committed flag table of its megatron-core version equals the table generated from its `arguments.py`
   (`python -m alignflow.frameworks.megatron_lm table`), defaults and switch values included;
2. the experiment's gpu_train command line, rendered for that version, goes through the real `parse_args` and
   `validate_args` in the step's own environment (what `--deterministic-mode` checks);
3. the real `core_transformer_config_from_args` builds the model config from those arguments, and alignflow's own
   mapping (`alignflow.frameworks.megatron_config`) builds the same config class with the same value in every field
   (or both raise the same error: what megatron-core refuses, `megatron_refusals` cites);
4. the real tokenizer built from those arguments (`build_tokenizer`) has the vocabulary, end-of-document id and
   padded vocabulary alignflow derives (`alignflow.frameworks.megatron_versions.null_tokenizer`).

Transformer Engine command lines run against alignflow's TE stand-in (`alignflow.frameworks.te_stand_in`) unless a
real TE imports; on a machine without CUDA, `validate_args`' one device question (the compute capability
`--moe-grouped-gemm` needs) is answered as an H100's (9, 0). Prints one JSON object per checkout x experiment and
exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

EXPERIMENTS = ("demo-megatron", "glm52_mini", "glm52_1b", "qwen35_dense", "qwen35_moe")

PROBE = r"""
import dataclasses, functools, importlib.util, json, os, sys, typing, warnings
warnings.simplefilter("ignore")
typing.override = getattr(typing, "override", lambda f: f)
checkout, version, flags, step_env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
if "transformer_engine" in flags and importlib.util.find_spec("transformer_engine") is None:
    from alignflow.frameworks import te_stand_in
    from alignflow.frameworks.megatron_versions import TE_STAND_IN_VERSION
    te_stand_in.install(TE_STAND_IN_VERSION)
import torch
if not torch.cuda.is_available():  # validate_args asks one device question (--moe-grouped-gemm): answer as an H100
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
sys.path.insert(0, checkout)
os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", **step_env})
from megatron.training.arguments import parse_args, validate_args
try:
    from megatron.training.arguments import core_transformer_config_from_args
except ImportError:
    from megatron.training.argument_utils import core_transformer_config_from_args
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from alignflow.frameworks.megatron_config import Symbol, config_class, config_kwargs, parse_args as af_parse, settle

def norm(v):
    if isinstance(v, functools.partial):
        return ["partial", norm(v.func), [norm(a) for a in v.args], {k: norm(x) for k, x in v.keywords.items()}]
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return {str(k): norm(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)

def build(make):
    try:
        c = make()
        return type(c).__name__, {f.name: norm(getattr(c, f.name)) for f in dataclasses.fields(c)}, None
    except Exception as exc:
        return None, None, f"{type(exc).__name__}: {exc}"

sys.argv = ["pretrain_gpt.py", *flags]
out = {}
args = parse_args()
try:
    validate_args(args, {})
    out["validate"] = "ok"
except BaseException as exc:  # what pretrain_gpt.py would stop at
    out["validate"] = f"{type(exc).__name__}: {exc}"
real_cls, real, real_err = build(lambda: core_transformer_config_from_args(args))
series = ".".join(version.split(".")[:2])
mine = settle(af_parse(flags, series))
cls = MLATransformerConfig if config_class(mine) == "MLATransformerConfig" else TransformerConfig
kw = {k: v.resolve() if isinstance(v, Symbol) else v
      for k, v in config_kwargs(mine, {f.name for f in dataclasses.fields(cls)}).items()}
our_cls, ours, our_err = build(lambda: cls(**kw))
diff = sorted(k for k in set(real or {}) | set(ours or {}) if (real or {}).get(k) != (ours or {}).get(k))
out["config"] = {"class": [real_cls, our_cls], "errors": [real_err, our_err],
                 "differing": {k: [(real or {}).get(k), (ours or {}).get(k)] for k in diff}}
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


def table_check(checkout: Path, version: str, env: dict[str, str]) -> str:
    from alignflow.frameworks.megatron_lm import load_table

    with tempfile.TemporaryDirectory() as tmp:  # --out: 0.16's arguments.py prints to stdout when imported
        out = Path(tmp) / "table.json"
        done = subprocess.run([sys.executable, "-m", "alignflow.frameworks.megatron_lm", "table", str(checkout),
                               "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            return f"generator failed: {done.stderr.strip().splitlines()[-1:]}"
        fresh = json.loads(out.read_text())
    committed = load_table(version)
    return "equal" if committed and committed["arguments"] == fresh["arguments"] else "DIFFERENT"


def check(checkout: Path, experiment: Path, version: str, env: dict[str, str]) -> dict[str, object]:
    from alignflow.backends.commands import step_command
    from alignflow.config import load_experiment
    from alignflow.frameworks.megatron_versions import null_tokenizer
    from alignflow.preflight.sides import _megatron_flags

    result: dict[str, object] = {"checkout": str(checkout), "version": version, "experiment": experiment.stem}
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


def good(r: dict[str, object]) -> bool:
    """Every check of `check`'s result held (the config: same class and fields, or the same refusal)."""
    ours = r.get("alignflow") or {}
    config = r.get("config") or {}
    same_config = (isinstance(config, dict) and not config.get("differing")
                   and len(set(config.get("class", []))) == 1 and len(set(config.get("errors", []))) == 1)
    return (r.get("parse") == "ok" and r.get("validate") == "ok" and same_config
            and all(r.get(k) == v for k, v in ours.items()))  # type: ignore[union-attr]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkouts", nargs="+", type=Path)
    ap.add_argument("--experiment", type=Path, action="append",
                    help="an experiment file (repeatable; default: every shipped Megatron experiment)")
    args = ap.parse_args()
    experiments = args.experiment or [REPO / "experiments" / f"{n}.yaml" for n in EXPERIMENTS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    failed = False
    for checkout in args.checkouts:
        checkout = checkout.resolve()
        version = checkout_version(checkout)
        table = table_check(checkout, version, env)
        failed |= table != "equal"
        print(json.dumps({"checkout": str(checkout), "version": version, "table": table}), flush=True)
        for experiment in experiments:
            r = check(checkout, experiment, version, env)
            ok = good(r)
            failed |= not ok
            print(json.dumps({**r, "ok": ok}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
