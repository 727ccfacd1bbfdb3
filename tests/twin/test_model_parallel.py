"""The PyTorch twin at tensor parallel 2 x pipeline parallel 2 (four gloo processes under torchrun) trains as one
process does: from alignflow's torch_dist checkpoint, and from legacy files written for that layout, it logs the
TP = 1 run's lm loss, mtp loss, load-balancing loss and grad norm within the printed resolution (one unit of the
last printed digit: the sums of tensor-parallel partial products round differently).

The ranks are Megatron's (tp fastest, the last rank on the last stage prints the iteration lines); the torch_dist
load reads each rank's pieces of the global tensors through megatron-core's own layout of that rank.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from alignflow.backends.twin import megatron_args
from alignflow.config.experiment import load_experiment
from alignflow.config.parallel import ParallelConfig
from alignflow.convert import convert_bf16, convert_to_megatron
from alignflow.logs import parse_log
from alignflow.twin.data import make_data
from alignflow.twin.render import twin_env
from tests.convert.synthetic import source_state, write_mindformers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLUMNS = ("lm_loss", "mtp_1_loss", "load_balancing_loss", "grad_norm")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, subprocess_env: dict[str, str]) -> dict:
    root = tmp_path_factory.mktemp("twin-mp")
    exp = load_experiment(repo_root / "experiments" / "demo.yaml")  # 4 layers: 2 per stage, MoE + MTP
    training = exp.training.model_copy(update={"steps": 6, "micro_batch_size": 2, "global_batch_size": 4})
    write_mindformers(root / "base", source_state("twin-moe", exp.model, dtype=torch.float32))
    convert_bf16(root / "base", root / "bf16")
    convert_to_megatron(root / "bf16", root / "legacy", spec="twin-moe", model=exp.model)
    convert_to_megatron(root / "bf16", root / "torch_dist", spec="twin-moe", model=exp.model,
                        ckpt_format="torch_dist", workers=2)
    convert_to_megatron(root / "bf16", root / "shards", spec="twin-moe", model=exp.model,
                        parallel=ParallelConfig(tp=2, pp=2))
    sha = make_data(root / "data" / "d", 60000, 7)
    env = {**subprocess_env, **twin_env(data_sha256=sha, megatron_version=exp.gpu.megatron_version),
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]:", "OMP_NUM_THREADS": "1"}
    return {"root": root, "exp": exp, "training": training, "env": env, "data": root / "data" / "d"}


def _train(world: dict, ckpt: str, fmt: str, tp: int = 1, pp: int = 1) -> tuple[str, object]:
    extra = [*(["--tensor-model-parallel-size", str(tp)] if tp > 1 else []),
             *(["--pipeline-model-parallel-size", str(pp)] if pp > 1 else [])]
    flags = megatron_args(world["exp"].model, world["training"], data_path=str(world["data"]),
                          load=str(world["root"] / ckpt), save=None, steps=world["training"].steps, ckpt_format=fmt,
                          extra_args=extra)
    launch = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(tp * pp), "--standalone",
               "--tee", "3"] if tp * pp > 1 else [sys.executable])
    done = subprocess.run([*launch, "-m", "alignflow.twin.torch_train", *flags], env=world["env"],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout, parse_log(done.stdout.splitlines(), fmt="megatron", first_interval="raw")


@pytest.fixture(scope="module")
def reference(world: dict) -> object:
    return _train(world, "legacy", "torch")[1]


@pytest.mark.parametrize(("ckpt", "fmt"), [("torch_dist", "torch_dist"), ("shards", "torch")])
def test_tp2_pp2_logs_what_one_process_logs(world: dict, reference: object, ckpt: str, fmt: str) -> None:
    out, got = _train(world, ckpt, fmt, tp=2, pp=2)
    ref = reference
    assert got.ranks == (3,)  # the last rank, on the last stage, prints the iteration lines
    assert list(got.frame.index) == list(ref.frame.index) == list(range(1, 7))
    for column in COLUMNS:
        resolution = ref.resolution[column]
        for step in ref.frame.index:
            a, b = float(ref.frame.loc[step, column]), float(got.frame.loc[step, column])
            assert abs(a - b) <= resolution.quantum(a) * 1.0001, (column, step, a, b)
    assert float(got.frame.loc[1, "lm_loss"]) == float(ref.frame.loc[1, "lm_loss"])  # step 1: the same forward
    loading = " loading distributed checkpoint from" if fmt == "torch_dist" else " loading checkpoint from"
    assert f"[0]:{loading}" in out
    assert "[0]:  successfully loaded checkpoint from" in out
    assert "[ t 1/2, gtp_remat 1/1, p 1/2 ]" in out
    assert "load_return" not in out


def test_a_torch_format_run_refuses_a_distributed_checkpoint(world: dict) -> None:
    flags = megatron_args(world["exp"].model, world["training"], data_path=str(world["data"]),
                          load=str(world["root"] / "torch_dist"), save=None, steps=1, ckpt_format="torch")
    done = subprocess.run([sys.executable, "-m", "alignflow.twin.torch_train", *flags], env=world["env"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 2
    assert "Detected load from a distributed checkpoint, but neither --use-dist-ckpt nor" in done.stderr


def test_tp2_pp2_with_full_recomputation_logs_what_one_process_logs(world: dict, reference: object) -> None:
    """Recomputation (each layer rerun in the backward pass) at tp 2 x pp 2: the tensor-parallel collectives run
    again in the recomputed forward, and the first stage reports its MoE layer's aux loss and router counts from
    the forward only (the recomputation appends its own to the same list)."""
    recomputing = {**world, "training": world["training"].model_copy(update={"recompute": "full"})}
    out, got = _train(recomputing, "shards", "torch", tp=2, pp=2)
    ref = reference
    assert list(got.frame.index) == list(range(1, 7))
    for column in COLUMNS:
        resolution = ref.resolution[column]
        for step in ref.frame.index:
            a, b = float(ref.frame.loc[step, column]), float(got.frame.loc[step, column])
            assert abs(a - b) <= resolution.quantum(a) * 1.0001, (column, step, a, b)
    # every rank of data-parallel rank 0 reports its memory, in Megatron's format
    for rank in range(4):
        assert f"[{rank}]:[Rank {rank}] (after 1 iterations) memory (MB) | allocated: " in out
