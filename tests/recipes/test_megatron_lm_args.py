"""The recipes' Megatron command lines parse with a real Megatron-LM's own argument parser.

The megatron-core wheel does not ship `megatron.training` (where `pretrain_gpt.py`'s flags are defined, many of
them generated from `TransformerConfig` since core 0.16), so this needs a Megatron-LM source checkout: point
`ALIGNFLOW_MEGATRON_LM` at it (e.g. on the GPU host, the checkout the recipes' `gpu.entry` lives in). Without
it the test is skipped, like the `gpu` tests on a machine without CUDA; CI checks the same command lines against
the committed flag tables instead (`tests/preflight/test_megatron_flags.py`), and the last test here checks that
the table of the checkout's version is its parser.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.backends import TrainSpec, render_training
from alignflow.backends.commands import data_placeholder, step_command
from alignflow.config import load_experiment
from alignflow.frameworks.megatron_versions import null_tokenizer
from alignflow.preflight.sides import _megatron_flags
from tests.recipes.copies import RECIPES

CHECKOUT = os.environ.get("ALIGNFLOW_MEGATRON_LM")

pytestmark = pytest.mark.skipif(not CHECKOUT, reason="ALIGNFLOW_MEGATRON_LM (a Megatron-LM checkout) is not set")

PARSE = """
import json, sys, typing, warnings
warnings.simplefilter("ignore")
typing.override = getattr(typing, "override", lambda f: f)  # Megatron-LM 0.18+ imports it (Python 3.12)
sys.path.insert(0, sys.argv[1])
from megatron.training.arguments import parse_args
sys.argv = ["pretrain_gpt.py", *json.loads(sys.argv[2])]
args = parse_args()
print(json.dumps({"padded": args.padded_vocab_size, "vocab_size": args.vocab_size, "seed": args.seed,
                  "train_iters": args.train_iters}))
"""


@pytest.mark.parametrize("name", [*RECIPES, "demo-megatron"])
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
        # NullTokenizer: --vocab-size V-1 up to 0.17 (it adds the eod id), V from 0.18
        assert parsed["vocab_size"] == int(null_tokenizer(exp.gpu.megatron_version).flags(exp.model.vocab_size)[1])
        assert parsed["seed"] == exp.training.seed


def test_the_committed_flag_table_is_the_checkouts_parser(subprocess_env: dict[str, str]) -> None:
    """Preflight's table for the checkout's megatron-core version equals its parser (regenerate it on a diff)."""
    import json

    from alignflow.frameworks.megatron_lm import load_table

    done = subprocess.run([sys.executable, "-m", "alignflow.frameworks.megatron_lm", "table", str(CHECKOUT)],
                          capture_output=True, text=True, env=subprocess_env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    fresh = json.loads(done.stdout)
    committed = load_table(fresh["megatron_core"])
    assert committed is not None, f"no table for megatron-core {fresh['megatron_core']}: commit this one"
    assert committed["arguments"] == fresh["arguments"], (
        f"alignflow's table differs from {fresh['source']}: regenerate it with "
        "`python -m alignflow.frameworks.megatron_lm table CHECKOUT --out alignflow/frameworks/megatron_flags/...`")
