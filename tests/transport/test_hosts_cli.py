"""`alignflow hosts check` and `alignflow hosts trust` against the SSH lab."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.transport import open_transport
from tests.lab.sshd import SSHLab

pytestmark = pytest.mark.integration


def _with_known_hosts(lab: SSHLab, tmp_path: Path, known: Path) -> Path:
    return lab.write_hosts_yaml(tmp_path / "hosts.yaml",
                                overrides={n: {"known_hosts": str(known)} for n in lab.hosts})


def _fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def test_check_reports_every_host_reachable_with_latency_and_snapshot(lab_hosts_yaml: Path) -> None:
    result = CliRunner().invoke(app, ["hosts", "check", "--hosts", str(lab_hosts_yaml), "--json"])
    assert result.exit_code == 0, result.output
    hosts = {h["name"]: h for h in json.loads(result.stdout)["hosts"]}
    assert set(hosts) == {"ascend", "cpu", "cuda"}
    for name, h in hosts.items():
        assert h["reachable"] is True
        assert h["reason"] is None
        assert h["role"] == name
        assert h["latency_ms"] > 0
        assert h["snapshot"]["python"]["version"].startswith("3.")
        assert h["snapshot"]["env"]["PYTHONPATH"]


def test_check_exits_1_and_says_why_when_a_host_is_down(ssh_lab: SSHLab, lab_hosts_yaml: Path) -> None:
    ssh_lab.stop_sshd("cuda")
    try:
        result = CliRunner().invoke(app, ["hosts", "check", "--hosts", str(lab_hosts_yaml), "--json"])
        table = CliRunner().invoke(app, ["hosts", "check", "--hosts", str(lab_hosts_yaml)], env={"COLUMNS": "250"})
    finally:
        ssh_lab.start_sshd("cuda")
    assert result.exit_code == 1
    hosts = {h["name"]: h for h in json.loads(result.stdout)["hosts"]}
    assert hosts["ascend"]["reachable"] is True
    assert hosts["cuda"]["reachable"] is False
    assert hosts["cuda"]["reason"].startswith("HostUnreachable: cuda: connection refused")
    assert table.exit_code == 1
    assert "UNREACHABLE" in table.stdout
    assert "connection refused" in table.stdout


def test_check_works_for_local_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"cpu": {"role": "cpu", "transport": "local", "workdir": "wd"}}}))
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(app, ["hosts", "check", "--hosts", str(hosts), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["hosts"][0]["reachable"] is True
    assert (tmp_path / "state" / "wd").is_dir()  # a relative local workdir lives under the state dir


def test_trust_adds_the_presented_key_and_then_the_host_works(ssh_lab: SSHLab, tmp_path: Path) -> None:
    known = tmp_path / "cfg" / "known_hosts"
    hosts = _with_known_hosts(ssh_lab, tmp_path, known)
    result = CliRunner().invoke(app, ["hosts", "trust", "cpu", "--hosts", str(hosts), "--yes"])
    assert result.exit_code == 0, result.output
    lab_host = ssh_lab.hosts["cpu"]
    assert _fingerprint(lab_host.sshd_dir / "ssh_host_ed25519_key.pub") in result.stdout
    assert _fingerprint(lab_host.sshd_dir / "ssh_host_ecdsa_key.pub") in result.stdout
    assert known.stat().st_mode & 0o777 == 0o600
    assert all(line.startswith(f"[{lab_host.address}]:{lab_host.port} ") for line in known.read_text().splitlines())
    with open_transport(ssh_lab.host("cpu", known_hosts=str(known))) as t:
        assert t.run(["echo", "ok"]).stdout == "ok\n"
    again = CliRunner().invoke(app, ["hosts", "trust", "cpu", "--hosts", str(hosts)])
    assert again.exit_code == 0
    assert "already trusted" in again.stdout


def test_trust_warns_about_a_changed_key_and_changes_nothing_unless_confirmed(ssh_lab: SSHLab,
                                                                              tmp_path: Path) -> None:
    cpu, ascend = ssh_lab.hosts["cpu"], ssh_lab.hosts["ascend"]
    wrong = " ".join((ascend.sshd_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    keep = ssh_lab.known_hosts_line("ascend")
    known.write_text(f"# managed by hand\n{keep}[{cpu.address}]:{cpu.port} {wrong}\n")
    hosts = _with_known_hosts(ssh_lab, tmp_path, known)
    before = known.read_text()
    refused = CliRunner().invoke(app, ["hosts", "trust", "cpu", "--hosts", str(hosts)], input="n\n")
    assert refused.exit_code == 1
    assert "DIFFERENT key(s)" in refused.output
    assert "man-in-the-middle" in refused.output
    assert known.read_text() == before
    accepted = CliRunner().invoke(app, ["hosts", "trust", "cpu", "--hosts", str(hosts)], input="y\n")
    assert accepted.exit_code == 0, accepted.output
    text = known.read_text()
    assert wrong not in text.split(f"[{cpu.address}]:{cpu.port} ", 1)[1]
    assert text.startswith(f"# managed by hand\n{keep}")  # other lines kept as they were
    with open_transport(ssh_lab.host("cpu", known_hosts=str(known))) as t:
        t.run(["true"])


def test_trust_refuses_local_hosts(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"cpu": {"role": "cpu", "transport": "local", "workdir": "wd"}}}))
    result = CliRunner().invoke(app, ["hosts", "trust", "cpu", "--hosts", str(hosts), "--yes"])
    assert result.exit_code == 1
    assert "no host key to trust" in result.output
