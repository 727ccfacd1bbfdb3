"""Fixtures of the flow tests: isolated state dirs, a tiny experiment (the Prefect harness is in tests/conftest.py).

Every flow test runs the real pipeline: MindSpore and PyTorch twins as detached jobs on local or SSH lab hosts,
the real converters, the store, Prefect's engine against the harness's API server.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from alignflow.convert.registry import SPEC_DIR

LOCAL_HOST_ENV = {"OMP_NUM_THREADS": "1"}
"""What the three local hosts set for every command (hosts.yaml `env:`, as a user sharing one machine between hosts
does): one OpenMP thread per process. The PyTorch twin's tiny steps each run hundreds of small parallel regions;
with the NPU and GPU trainings side by side on a busy 2-core machine, OpenMP's spinning threads wait out each other's
time slices: a gpu_train step took 1.5-6.8 s, 0.1-0.4 s with one thread (8 steps: 41-47 s, 16-17 s; 7.6 CPU-s,
2.7; load 18 on 2 cores, 2026-12-06)."""


@dataclass(frozen=True)
class FlowEnv:
    root: Path
    state: Path
    experiment: Path
    hosts: Path

    def edit_experiment(self, **changes: object) -> None:
        data = yaml.safe_load(self.experiment.read_text())
        for dotted, value in changes.items():
            node = data
            *parents, last = dotted.split("__")
            for p in parents:
                node = node[p]
            node[last] = value
        self.experiment.write_text(yaml.safe_dump(data, sort_keys=False))


def make_flow_env(root: Path, repo_root: Path, hosts: Path | None = None) -> FlowEnv:
    """A directory with the tiny experiment, a copy of the twin-moe spec (so a test can edit it) and hosts."""
    root.mkdir(parents=True, exist_ok=True)
    experiment = root / "tiny.yaml"
    shutil.copy(repo_root / "tests" / "data" / "flow" / "tiny.yaml", experiment)
    shutil.copy(SPEC_DIR / "twin-moe.yaml", root / "twin-moe.yaml")
    if hosts is None:
        hosts = root / "hosts.yaml"
        hosts.write_text(yaml.safe_dump({"hosts": {
            name: {"role": name, "transport": "local", "workdir": f"hosts/{name}", "env": LOCAL_HOST_ENV}
            for name in ("ascend", "cpu", "cuda")
        }}))
    return FlowEnv(root=root, state=root / "state", experiment=experiment, hosts=hosts)


@pytest.fixture
def flow_env_vars(monkeypatch: pytest.MonkeyPatch, repo_root: Path) -> None:
    """Jobs on local hosts import this checkout; Prefect does not persist task results."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("GLOG_v", "3")
