"""Fixtures of the reference-twin tests: one data file, one MindSpore base checkpoint, runners for both sides.

Both entry points run as real subprocesses (`python -m alignflow.twin.mindspore_train` / `torch_train`)
with this checkout on PYTHONPATH, exactly as the pipeline launches them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from alignflow.backends.twin import megatron_args
from alignflow.config.model import TrainingConfig
from alignflow.twin.data import make_data
from alignflow.twin.presets import preset
from alignflow.twin.render import mindformers_config, twin_env

BASE_STEPS = 4
# The MindSpore runs of these tests are PyNative, without mindspore.jit (`jit=False`): for a few steps the compile
# costs more than it saves (step 1 takes 8 s with it on the 2-core CPU, a PyNative step 0.25 s; 4 steps: 10.7 s
# against 2.8 s a process). jit trains the same (test_resume), and the demo's flows run it.
TIMEOUT_S = 600


@dataclass(frozen=True)
class TwinData:
    path: Path
    sha256: str


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines(keepends=True)


def training(steps: int, **overrides: Any) -> TrainingConfig:
    fields: dict[str, Any] = dict(seed=1234, steps=steps, lr=1e-3, lr_warmup_iters=3, micro_batch_size=4,
                                  global_batch_size=4, bf16=False)
    fields.update(overrides)
    return TrainingConfig(**fields)


def run_mindspore(cfg: dict[str, Any], workdir: Path, env: dict[str, str]) -> Run:
    """Write `cfg` as YAML and run the MindSpore entry point on it."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "twin.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return _run([sys.executable, "-m", "alignflow.twin.mindspore_train", "--config", str(config), "--mode", "1"],
                workdir, env)


def run_torch(argv: list[str], workdir: Path, env: dict[str, str], *, data: TwinData | None = None,
              version: str = "0.16", sha256: str | None = None) -> Run:
    """The PyTorch twin on `argv` (real Megatron flags); its own settings (the sha256 of `data` it must verify, the
    megatron-core `version` it mimics) in its environment, as the backend passes them."""
    workdir.mkdir(parents=True, exist_ok=True)
    twin = twin_env(data_sha256=sha256 or (data.sha256 if data else None), megatron_version=version)
    return _run([sys.executable, "-m", "alignflow.twin.torch_train", *argv], workdir, {**env, **twin})


def _run(argv: list[str], workdir: Path, env: dict[str, str]) -> Run:
    env = {**env, "LOCAL_DEFAULT_PATH": str(workdir / "output"), "GLOG_v": "3"}
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    return Run(done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="session")
def twin_data(tmp_path_factory: pytest.TempPathFactory) -> TwinData:
    path = tmp_path_factory.mktemp("twin-data") / "data"  # a prefix: data.bin + data.idx
    return TwinData(path, make_data(path, 20_000, seed=7))


@pytest.fixture(scope="session")
def ms_base(tmp_path_factory: pytest.TempPathFactory, twin_data: TwinData, subprocess_env: dict[str, str]) -> Path:
    """A twin-moe MindSpore base training from scratch: checkpoints at steps 2 and 4 (with optimizer state)."""
    work = tmp_path_factory.mktemp("ms-base")
    cfg = mindformers_config(preset("twin-moe"), training(BASE_STEPS), data_path=str(twin_data.path),
                             data_sha256=twin_data.sha256, load_path=None, save_path=str(work / "base"),
                             steps=BASE_STEPS, save_interval=2, jit=False)
    run = run_mindspore(cfg, work, subprocess_env)
    assert run.returncode == 0, run.stdout + run.stderr
    (work / "base.log").write_text(run.stdout)
    return work / "base"


def torch_argv(data: TwinData, *, load: Path | str | None, steps: int, save: Path | None = None,
               **kw: Any) -> list[str]:
    return megatron_args(preset(kw.pop("name", "twin-moe")), training(steps), data_path=str(data.path),
                         load=None if load is None else str(load), save=None if save is None else str(save),
                         steps=steps, **kw)
