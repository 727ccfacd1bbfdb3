"""Real megatron-core 0.16.1 GPTModels at tensor, pipeline and expert parallel size 2 - eight gloo processes on
the CPU, under torchrun - load alignflow's torch_dist checkpoint through `dist_checkpointing.load` (strict:
RAISE_ALL) and its legacy files of that layout through `load_state_dict(strict=True)`, and every sharded tensor of
every rank equals the TP = 1 model's (`benchmarks/megatron_dist_load_check.py`, the script a GPU run uses too).

The TP = 1 reference is independent of the distributed writers: the single-file legacy checkpoint loaded into a
TP = 1 GPTModel, its global tensors assembled from its own sharded state dict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from alignflow.config.parallel import ParallelConfig
from alignflow.convert import convert_bf16, convert_to_megatron

from .synthetic import source_state, write_mindformers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = "benchmarks/megatron_dist_load_check.py"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, subprocess_env: dict[str, str]) -> Path:
    root = tmp_path_factory.mktemp("mcore-dist")
    write_mindformers(root / "base", source_state("twin-moe", dtype=torch.float32))
    convert_bf16(root / "base", root / "bf16")
    convert_to_megatron(root / "bf16", root / "legacy", spec="twin-moe")
    convert_to_megatron(root / "bf16", root / "torch_dist", spec="twin-moe", ckpt_format="torch_dist", workers=2)
    convert_to_megatron(root / "bf16", root / "shards", spec="twin-moe", parallel=ParallelConfig(tp=2, pp=2, ep=2,
                                                                                                  dp=2))
    ref = subprocess.run([sys.executable, str(repo_root / SCRIPT), "--reference", str(root / "legacy"), "--spec",
                          "twin-moe", "--out", str(root / "reference.pt")], env=subprocess_env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert json.loads(ref.stdout.splitlines()[-1])["strict_load"] == "<All keys matched successfully>"
    return root


def _world(repo_root: Path, env: dict[str, str], ckpts: list[Path], reference: Path, reports: list[Path], *,
           tp: int, pp: int, ep: int) -> tuple[int, list[dict]]:
    """One torchrun world checks `ckpts` one after the other (a world's start-up - eight interpreters importing
    megatron-core - is most of the cost on a CPU); one world report per checkpoint."""
    nproc = tp * pp * max(ep, 1)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), str(repo_root / SCRIPT), *map(str, ckpts), "--spec", "twin-moe", "--tp",
                           str(tp), "--pp", str(pp), "--ep", str(ep), "--expected", str(reference),
                           *(a for r in reports for a in ("--json", str(r))), "--device", "cpu"],
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=1200,
                          check=False)
    assert all(r.is_file() for r in reports), done.stderr[-3000:]
    return done.returncode, [json.loads(r.read_text()) for r in reports]


FORMATS = ["torch_dist", "shards"]


@pytest.fixture(scope="module")
def tp2_pp2_ep2(converted: Path, repo_root: Path, subprocess_env: dict[str, str]) -> tuple[int, dict[str, dict]]:
    """Both formats, checked by the same world of eight."""
    rc, reports = _world(repo_root, subprocess_env, [converted / fmt for fmt in FORMATS], converted / "reference.pt",
                         [converted / f"{fmt}.json" for fmt in FORMATS], tp=2, pp=2, ep=2)
    return rc, dict(zip(FORMATS, reports, strict=True))


@pytest.mark.parametrize("fmt", FORMATS)
def test_real_gpt_models_at_tp2_pp2_ep2_load_the_checkpoint_strictly_and_equal_tp1(
        tp2_pp2_ep2: tuple[int, dict[str, dict]], converted: Path, fmt: str) -> None:
    rc, reports = tp2_pp2_ep2
    report = reports[fmt]
    assert rc == 0, reports
    assert report["checkpoint"] == str(converted / fmt)
    assert report["ok"]
    assert report["megatron_core"] == "0.16.1"
    assert report["world"] == 8
    ranks = report["ranks"]
    assert sorted((r["tp"], r["pp"], r["ep"]) for r in ranks) == [(t, p, e) for t in (0, 1) for p in (0, 1)
                                                                   for e in (0, 1)]
    for r in ranks:
        assert r["strict_load"] == "<All keys matched successfully>", r
        assert r["differing"] == [], r
        assert r["compared"] == (23 if r["pp"] == 0 else 52)  # sharded tensors of the stage, SwiGLU halves apart
        assert r["common"]["checkpoint_version"] == 3.0
    if fmt == "shards":
        assert {r["file"] for r in ranks} == {f"mp_rank_{t:02d}_{p:03d}_{e:03d}" for t in (0, 1) for p in (0, 1)
                                              for e in (0, 1)}


def test_the_check_fails_for_other_weights(converted: Path, repo_root: Path, subprocess_env: dict[str, str],
                                           tmp_path: Path) -> None:
    write_mindformers(tmp_path / "base", source_state("twin-moe", dtype=torch.float32, seed=1))
    convert_bf16(tmp_path / "base", tmp_path / "bf16")
    convert_to_megatron(tmp_path / "bf16", tmp_path / "other", spec="twin-moe", ckpt_format="torch_dist")
    rc, (report,) = _world(repo_root, subprocess_env, [tmp_path / "other"], converted / "reference.pt",
                           [tmp_path / "other.json"], tp=2, pp=1, ep=1)
    assert rc == 1
    assert not report["ok"]
    assert all(r["strict_load"] == "<All keys matched successfully>" for r in report["ranks"])  # names are right...
    assert all(len(r["differing"]) == r["compared"] for r in report["ranks"])  # ... every value is not
