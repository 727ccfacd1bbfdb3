"""`alignflow run` looks up the names of the SSH hosts its steps use before it starts Prefect (issue 45): the hosts
of the steps it runs, not the whole inventory. No lookup here asks a resolver: `.invalid` names and IP addresses."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config import load_experiment, load_hosts
from alignflow.errors import ConfigError
from flows.cli import check_host_names


def test_only_the_hosts_of_the_steps_run_are_looked_up(repo_root: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "state"))
    example = (repo_root / "hosts.ssh.example.yaml").read_text()
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(example.replace("address: 192.0.2.10", "address: npu-nonexistent.invalid"))
    inventory = load_hosts(hosts, state_dir=tmp_path / "state")
    experiment = load_experiment(repo_root / "experiments" / "demo.yaml", inventory)
    check_host_names(experiment, inventory, only=["convert_bf16", "gpu_train"])  # cpu-a and gpu-a: IP addresses
    with pytest.raises(ConfigError) as info:
        check_host_names(experiment, inventory)
    assert [(p[0], p[2].split(":")[0]) for p in info.value.problems] == [(str(hosts), "hosts.npu-a.address")]
    assert not (tmp_path / "state").exists()
