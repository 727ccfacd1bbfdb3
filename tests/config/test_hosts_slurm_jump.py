"""hosts.yaml for clusters: `scheduler: slurm`, `devices`, `proxy_jump` and opt-in `~/.ssh/config`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alignflow.config.hosts import Host, load_hosts
from alignflow.config.sshconfig import ssh_config_fields
from alignflow.errors import ConfigError


def _write(tmp_path: Path, hosts: dict[str, object]) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    return path


def test_a_slurm_host_gets_default_slurm_settings_and_its_gpus_are_its_devices(tmp_path: Path) -> None:
    inv = load_hosts(_write(tmp_path, {
        "h200": {"role": "cuda", "workdir": "/w", "scheduler": "slurm",
                 "slurm": {"partition": "gpu", "nodes": 2, "gpus_per_node": 8}},
        "login": {"role": "cuda", "workdir": "/w", "scheduler": "slurm"},
        "box": {"role": "cuda", "workdir": "/w", "devices": 4},
    }))
    assert (inv.get("h200").nodes, inv.get("h200").devices_per_node) == (2, 8)
    assert inv.get("login").slurm is not None
    assert inv.get("login").slurm.partition is None
    assert (inv.get("box").nodes, inv.get("box").devices_per_node) == (1, 4)


def test_slurm_settings_on_a_direct_host_are_refused_at_their_line(tmp_path: Path) -> None:
    path = _write(tmp_path, {"a": {"role": "cuda", "workdir": "/w", "slurm": {"partition": "gpu"}}})
    with pytest.raises(ConfigError, match=r"hosts.yaml:\d+: hosts.a: .*scheduler is direct; set scheduler: slurm"):
        load_hosts(path)


def test_a_bad_slurm_time_limit_is_refused_at_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, {"a": {"role": "cuda", "workdir": "/w", "scheduler": "slurm",
                                   "slurm": {"time_limit": "4 hours"}}})
    with pytest.raises(ConfigError, match=r"hosts.yaml:\d+: hosts.a.slurm.time_limit: .*not a Slurm time"):
        load_hosts(path)


def test_proxy_jump_names_another_host_or_gives_user_address_port(tmp_path: Path) -> None:
    inv = load_hosts(_write(tmp_path, {
        "bastion": {"role": "controller", "transport": "ssh", "address": "gw.example.org", "port": 2222,
                    "user": "jump", "identity_file": "~/.ssh/gw", "workdir": "/tmp/af"},
        "gpu": {"role": "cuda", "transport": "ssh", "address": "10.0.0.7", "user": "alice", "workdir": "/w",
                "proxy_jump": "bastion"},
        "npu": {"role": "ascend", "transport": "ssh", "address": "10.0.0.8", "user": "alice", "workdir": "/w",
                "proxy_jump": "bob@gw2.example.org:2200"},
    }))
    gpu, npu = inv.get("gpu").proxy_jump, inv.get("npu").proxy_jump
    assert gpu is not None
    assert (gpu.address, gpu.port, gpu.user, gpu.identity_file) == (
        "gw.example.org", 2222, "jump", "~/.ssh/gw")
    assert npu is not None
    assert (npu.address, npu.port, npu.user) == ("gw2.example.org", 2200, "bob")


def test_a_chain_of_jumps_is_refused_saying_one_hop_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one jump host only"):
        load_hosts(_write(tmp_path, {"a": {"role": "cuda", "transport": "ssh", "address": "x", "user": "u",
                                           "workdir": "/w", "proxy_jump": "gw1,gw2"}}))
    with pytest.raises(ValueError, match="transport ssh only"):
        Host(name="a", role="cuda", workdir="/w", proxy_jump="gw")


def test_ssh_config_fills_what_hosts_yaml_leaves_out_and_never_overrides_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host cluster\n  HostName login.cluster.example\n  User alice\n  Port 2022\n  IdentityFile ~/.ssh/cl\n"
        "  ProxyJump gw\n  StrictHostKeyChecking no\n"
        "Host gw\n  HostName gw.example.org\n  User jumper\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ssh_config_fields("cluster")["proxy_jump"] == {"address": "gw"}
    inv = load_hosts(_write(tmp_path, {
        "c": {"role": "cuda", "transport": "ssh", "address": "cluster", "ssh_config": True, "workdir": "/w"},
        "d": {"role": "cuda", "transport": "ssh", "address": "cluster", "ssh_config": True, "workdir": "/w",
              "user": "bob", "port": 22},
        "e": {"role": "cuda", "transport": "ssh", "address": "cluster", "user": "carol", "workdir": "/w"},
    }))
    c, d, e = inv.get("c"), inv.get("d"), inv.get("e")
    assert (c.address, c.user, c.port, c.identity_file) == ("login.cluster.example", "alice", 2022,
                                                            str(tmp_path / ".ssh" / "cl"))
    assert c.proxy_jump is not None
    assert (c.proxy_jump.address, c.proxy_jump.user) == ("gw.example.org", "jumper")
    assert (d.user, d.port) == ("bob", 22)  # written in hosts.yaml: kept
    assert (e.address, e.proxy_jump) == ("cluster", None)  # not opted in: ~/.ssh/config is not read


def test_an_opted_in_host_without_a_user_anywhere_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = _write(tmp_path, {"c": {"role": "cuda", "transport": "ssh", "address": "nowhere", "ssh_config": True,
                                   "workdir": "/w"}})
    with pytest.raises(ConfigError, match=r"no user, neither in this file nor for nowhere in ~/\.ssh/config"):
        load_hosts(path)
