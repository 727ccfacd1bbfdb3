"""The recipes' Megatron command lines parse with a real Megatron-LM's own argument parser.

The megatron-core wheel does not ship `megatron.training` (where `pretrain_gpt.py`'s flags are defined, many of
them generated from `TransformerConfig` since core 0.16), so this needs a Megatron-LM source checkout: point
`ALIGNFLOW_MEGATRON_LM` at it (e.g. on the GPU host, the checkout the recipes' `gpu.entry` lives in). Without
it the test is skipped, like the `gpu` tests on a machine without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.backends import TrainSpec, render_training
from alignflow.config import load_experiment
from alignflow.preflight.sides import _megatron_flags
from alignflow.runner.commands import data_placeholder, step_command
from tests.recipes.copies import RECIPES

CHECKOUT = os.environ.get("ALIGNFLOW_MEGATRON_LM")

pytestmark = pytest.mark.skipif(not CHECKOUT, reason="ALIGNFLOW_MEGATRON_LM (a Megatron-LM checkout) is not set")

PARSE = """
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, sys.argv[1])
from megatron.training.arguments import parse_args
sys.argv = ["pretrain_gpt.py", *json.loads(sys.argv[2])]
args = parse_args()
print(json.dumps({"padded": args.padded_vocab_size, "vocab_size": args.vocab_size, "seed": args.seed,
                  "train_iters": args.train_iters}))
"""


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_flags_parse_with_megatron_lm(repo_root: Path, name: str, subprocess_env: dict[str, str]) -> None:
    import json

    exp = load_experiment(repo_root / "experiments" / f"{name}.yaml")
    gate = TrainSpec("early_gate", "gpu", exp.gate.steps, data_placeholder(exp), "", "{in:megatron_ckpt}", None)
    for argv in (step_command(exp, "gpu_train", data_sha256="").template.argv, render_training(exp, gate).argv):
        flags = list(_megatron_flags(exp, argv))
        done = subprocess.run([sys.executable, "-c", PARSE, str(CHECKOUT), json.dumps(flags)], capture_output=True,
                              text=True, env=subprocess_env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        parsed = json.loads(done.stdout.strip().splitlines()[-1])
        assert parsed["vocab_size"] == exp.model.vocab_size - 1  # NullTokenizer adds the eod id
        assert parsed["seed"] == exp.training.seed
