"""Fixtures of the diagnose tests: a converted twin-moe checkpoint pair, an experiment, two local hosts.

The checkpoints are made without a MindSpore training: a seeded random PyTorch twin is saved as a bf16 Megatron
checkpoint, converted to MindFormers with the spec's inverse (the NPU side's bf16 checkpoint), and that is
converted forward again (the GPU side's Megatron checkpoint) — the pipeline's own `convert_megatron` direction.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host
from alignflow.twin.data import make_data

SPEC = "twin-moe"


@dataclass(frozen=True)
class Converted:
    data: Path
    sha256: str
    bf16: Path  # MindFormers bf16 checkpoint (NPU side)
    megatron: Path  # Megatron checkpoint converted from it (GPU side)


def make_checkpoints(root: Path, *, seed: int = 3) -> tuple[Path, Path]:
    import torch

    from alignflow.convert.engine import convert_to_megatron, convert_to_mindformers
    from alignflow.convert.megatron import write_megatron
    from alignflow.twin.presets import preset, twin_spec
    from alignflow.twin.torch_model import TwinGPTTorch

    torch.manual_seed(seed)
    model = TwinGPTTorch(twin_spec(preset(SPEC)))
    state = {k: (v.to(torch.bfloat16).contiguous() if isinstance(v, torch.Tensor) else v)
             for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    seedckpt = root / "seed-megatron"
    seedckpt.mkdir(parents=True)
    write_megatron(seedckpt, state, 1)
    convert_to_mindformers(seedckpt, root / "bf16", spec=SPEC)
    convert_to_megatron(root / "bf16", root / "megatron", spec=SPEC)
    return root / "bf16", root / "megatron"


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Converted:
    root = tmp_path_factory.mktemp("diagnose-ckpt")
    sha = make_data(root / "data" / "data", 20_000, seed=7)  # an indexed dataset: data/data.bin + data/data.idx
    bf16, megatron = make_checkpoints(root)
    return Converted(root / "data", sha, bf16, megatron)


def experiment(converted: Converted, spec: str = SPEC, **sides: Any) -> Experiment:
    """A twin-moe experiment over the fixture's data; `npu=`/`gpu=` backend sections (e.g. an injection env);
    `spec`: another conversion spec (a path)."""
    from alignflow.twin.presets import preset

    return Experiment.model_validate({
        "name": "diagnose-test",
        "data": {"path": str(converted.data), "prefix": "data", "sha256": converted.sha256},
        "model": preset(SPEC).model_dump(mode="json"),
        "training": {"seed": 1234, "steps": 4, "lr": 1e-3, "lr_warmup_iters": 0, "lr_decay_style": "constant",
                     "clip_grad": 1.0, "micro_batch_size": 4, "global_batch_size": 4, "bf16": False},
        "conversion": {"spec": spec},
        **sides,
    })


def local_hosts(root: Path, subprocess_env: dict[str, str]) -> dict[str, Host]:
    """The two sides' hosts: local ones with their workdirs under `root`."""
    env = {"PYTHONPATH": subprocess_env["PYTHONPATH"], "GLOG_v": "3"}
    return {side: Host(name=name, role=role, transport="local", workdir=str(root / name), python=sys.executable,
                       env=env)
            for side, name, role in (("npu", "ascend", "ascend"), ("gpu", "cuda", "cuda"))}


@pytest.fixture
def hosts(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, Host]:
    return local_hosts(tmp_path, subprocess_env)
