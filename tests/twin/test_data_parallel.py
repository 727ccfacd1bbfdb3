"""The PyTorch twin under torchrun: two data-parallel ranks (gloo, CPU) train exactly as one process does.

Same seed, same global batch (4 = micro batch 2 x dp 2): Megatron's sampler gives each rank its micro-batch of
the step's samples, the gradients are summed over the ranks, so the logged losses and gradient norms are the
one-process run's, line for line at the printed precision. The last rank prints the iteration lines, rank 0 the
set-up lines, as Megatron's print_rank_last / print_rank_0 do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.backends.twin import megatron_args
from alignflow.config.experiment import load_experiment
from alignflow.logs import parse_log
from alignflow.twin.data import make_data
from alignflow.twin.render import twin_env

pytestmark = pytest.mark.integration


def test_two_data_parallel_ranks_log_what_one_process_logs(repo_root: Path, tmp_path: Path,
                                                           subprocess_env: dict[str, str]) -> None:
    exp = load_experiment(repo_root / "tests" / "data" / "flow" / "tiny.yaml")
    training = exp.training.model_copy(update={"micro_batch_size": 2, "global_batch_size": 4})
    data = tmp_path / "data" / "tiny"  # an indexed dataset: data/tiny.bin + .idx
    sha = make_data(data, 20000, 7)
    flags = megatron_args(exp.model, training, data_path=str(data), load=None, save=None, steps=3)
    env = {**subprocess_env, **twin_env(data_sha256=sha, megatron_version=exp.gpu.megatron_version),
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]:"}
    one = subprocess.run([sys.executable, "-m", "alignflow.twin.torch_train", *flags], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                          "--tee", "3", "-m", "alignflow.twin.torch_train", *flags], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert two.returncode == 0, two.stderr[-2000:]
    single = parse_log(one.stdout.splitlines(), fmt="megatron")
    ranked = parse_log(two.stdout.splitlines(), fmt="megatron")
    assert ranked.ranks == (1,)  # only the last rank prints iteration lines
    assert ranked.rank == 1
    assert list(ranked.frame.index) == list(single.frame.index) == [1, 2, 3]
    for column in ("lm_loss", "grad_norm", "mtp_1_loss", "load_balancing_loss"):
        assert list(ranked.frame[column]) == list(single.frame[column]), column
    assert "[0]:training ..." in two.stdout
    assert "[1]:training ..." not in two.stdout
