"""ProxyJump on real sshd: a lab host reachable only through another (tests/lab/jump.py).

Commands (paramiko, a direct-tcpip channel through the bastion), detached jobs and bulk copies (OpenSSH's
rsync with `ProxyJump` in the generated config) all reach the inner host; both hops' host keys are checked
against the managed known_hosts, each with the reject policy.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from alignflow.errors import HostKeyRejected, HostUnreachable
from alignflow.transport import JobSpec, Transport, controller_transport, open_transport
from alignflow.transport.keyscan import fetch_host_keys
from alignflow.transport.openssh import render_config
from tests.lab.jump import JumpLab
from tests.lab.sshd import LabUnavailable

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def jump_lab() -> Iterator[JumpLab]:
    try:
        lab = JumpLab.start()
    except LabUnavailable as exc:
        pytest.fail(f"jump lab unavailable: {exc}")
    try:
        yield lab
    finally:
        lab.close()


def _openssh_refusal(t: Transport) -> str:
    """What OpenSSH (the bulk-copy channel, with the generated config) says when asked to run `true` there."""
    client = t.shell.openssh_client()
    assert client is not None
    done = subprocess.run(client.ssh_argv("true"), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 255
    return done.stderr


def test_the_inner_host_cannot_be_reached_directly(jump_lab: JumpLab) -> None:
    with open_transport(jump_lab.host("inner")) as t, pytest.raises(HostUnreachable, match="connection refused"):
        t.run(["true"])


def test_commands_and_jobs_reach_the_inner_host_through_the_bastion(jump_lab: JumpLab) -> None:
    with open_transport(jump_lab.inner_via_bastion()) as t:
        done = t.run(["bash", "-c", 'echo "$(id -un) $SSH_CONNECTION"'])
        user, _, _, server_ip, server_port = done.stdout.split()
        assert user == jump_lab.hosts["inner"].user
        assert (server_ip, int(server_port)) == ("127.0.0.15", jump_lab.hosts["inner"].port)
        handle = t.launch(JobSpec(["bash", "-c", "echo from the inner host"], name="behind-a-jump"))
        assert t.wait(handle, poll_s=0.2, timeout_s=60).ok
        assert t.tail(handle) == "from the inner host\n"


def test_bulk_copies_go_through_the_jump_with_openssh(jump_lab: JumpLab, tmp_path: Path) -> None:
    host = jump_lab.inner_via_bastion()
    config = render_config(host, control_path=None)
    assert "  ProxyJump alignflow-jump\n" in config
    assert f"Host alignflow-jump\n  HostName 127.0.0.14\n  Port {jump_lab.hosts['bastion'].port}\n" in config
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "weights.bin").write_bytes(b"\x01" * 300_000)
    (src / "meta.json").write_text('{"iteration": 1}')
    with open_transport(host) as t:
        sent = t.put(str(src), "inputs/ckpt")
        back = t.get("inputs/ckpt", str(tmp_path / "back"))
        assert t.run(["bash", "-c", "ls inputs/ckpt | sort"]).stdout.split() == ["meta.json", "weights.bin"]
    assert sent.sha256 == back.sha256 == controller_transport().sha256([str(src)])[str(src)].sha256


def test_an_unknown_jump_host_key_is_rejected_naming_the_jump(jump_lab: JumpLab, tmp_path: Path) -> None:
    only_inner = tmp_path / "known_hosts"
    only_inner.write_text(jump_lab.known_hosts_line("inner"))
    host = jump_lab.inner_via_bastion(known_hosts=str(only_inner))
    with open_transport(host) as t:
        with pytest.raises(HostKeyRejected) as err:
            t.run(["true"])
        assert err.value.host == "inner-jump"
        assert "unknown host key for [127.0.0.14]" in str(err.value)
        assert "alignflow hosts trust inner-jump" in str(err.value)
        # the jump's own ssh refuses the bastion's key; the outer ssh sees its proxy close (exit 255 either way)
        assert "kex_exchange_identification: Connection closed" in _openssh_refusal(t)


def test_an_unknown_inner_host_key_is_rejected_on_both_channels(jump_lab: JumpLab, tmp_path: Path) -> None:
    only_bastion = tmp_path / "known_hosts"
    only_bastion.write_text(jump_lab.known_hosts_line("bastion"))
    host = jump_lab.inner_via_bastion(known_hosts=str(only_bastion))
    with open_transport(host) as t:
        with pytest.raises(HostKeyRejected) as err:
            t.run(["true"])
        assert err.value.host == "inner"
        assert "unknown host key for [127.0.0.15]" in str(err.value)
        assert "Host key verification failed" in _openssh_refusal(t)  # the bulk channel refuses it too
    assert {k.kind for k in fetch_host_keys(host)} == {"ssh-ed25519", "ecdsa-sha2-nistp256"}  # to trust them


def test_an_opted_in_host_takes_its_jump_from_the_users_ssh_config(jump_lab: JumpLab, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from alignflow.config import load_hosts

    b, i = jump_lab.hosts["bastion"], jump_lab.hosts["inner"]
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        f"Host gpu-cluster\n  HostName {i.address}\n  Port {i.port}\n  User {i.user}\n  ProxyJump gw\n"
        f"Host gw\n  HostName {b.address}\n  Port {b.port}\n  User {b.user}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"inner": {
        "role": "cuda", "transport": "ssh", "address": "gpu-cluster", "ssh_config": True,
        "identity_file": str(jump_lab.client_key), "known_hosts": str(jump_lab.known_hosts),
        "workdir": str(i.workdir), "connect_timeout_s": 5.0}}}))
    with open_transport(load_hosts(hosts).get("inner")) as t:
        assert t.run(["id", "-un"]).stdout.strip() == i.user
