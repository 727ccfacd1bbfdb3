"""The PyTorch twin's `--deterministic-mode` sets torch's deterministic flag for its eager kernels without importing
torch's compiler stack (`torch.use_deterministic_algorithms` imports inductor and dynamo for a `torch.compile`
setting the twin never uses: 1.35 of the twin's 3.3 CPU-s)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

PROBE = """
import sys, torch
from alignflow.twin.torch_train import _deterministic_eager_kernels
_deterministic_eager_kernels(torch)
print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
      "torch._dynamo" in sys.modules, "torch._inductor" in sys.modules)
"""


def test_deterministic_mode_sets_the_eager_flag_warn_only_and_leaves_the_compiler_unimported(
        subprocess_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], env=subprocess_env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "False", "False"]
