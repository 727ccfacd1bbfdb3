"""Local hosts copy without rsync (a machine with only Python and make runs the demo); SSH copies say what to install.

The machine here has rsync, so each test runs with a PATH that has every tool but rsync (real tools, symlinked).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from alignflow.config.hosts import Host
from alignflow.errors import ConfigError, FingerprintMismatch
from alignflow.fingerprint import Fingerprinter
from alignflow.transport import copy_between, open_transport
from alignflow.transport.routes import sender_for

pytestmark = pytest.mark.integration  # real processes: the command line, hosts' commands


@pytest.fixture
def no_rsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if tool.name != "rsync" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setenv("ALIGNFLOW_HASH_MEMO", str(tmp_path / "memo.sqlite"))


def _host(tmp_path: Path, name: str) -> Host:
    return Host(name=name, role="cpu", transport="local", workdir=str(tmp_path / name))


def test_local_hosts_copy_a_directory_verified_without_rsync(no_rsync: None, tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    (src / "sub dir").mkdir(parents=True)
    (src / "w.bin").write_bytes(os.urandom(200_000))
    (src / "sub dir" / "it's;$(x).json").write_text('{"k": 1}')
    (src / "w.bin").chmod(0o640)
    (src / "link.json").symlink_to(src / "sub dir" / "it's;$(x).json")  # a copy holds content, not links
    seen: list[tuple[int, int]] = []
    with open_transport(_host(tmp_path, "a")) as a, open_transport(_host(tmp_path, "b")) as b:
        a.put(str(src), "ckpt")
        got = copy_between(a, "ckpt", b, "in/ckpt", progress=lambda d, t: seen.append((d, t)))
        assert got == Fingerprinter().fingerprint(src) == b.sha256(["in/ckpt"])["in/ckpt"]
        copied = tmp_path / "b" / "in" / "ckpt"
        assert not (copied / "link.json").is_symlink()
        assert (copied / "w.bin").stat().st_mode & 0o777 == 0o640
        assert (copied / "w.bin").stat().st_mtime_ns // 10**6 == (src / "w.bin").stat().st_mtime_ns // 10**6
        assert seen[-1] == (got.size, got.size)
        assert sorted(p.name for p in (tmp_path / "b" / "in").iterdir()) == ["ckpt"]  # no staging leftovers


def test_without_rsync_a_changed_source_is_still_refused(no_rsync: None, tmp_path: Path) -> None:
    with open_transport(_host(tmp_path, "a")) as a, open_transport(_host(tmp_path, "b")) as b:
        a.write_text("w.json", '{"weights": 1}')
        recorded = a.sha256(["w.json"])["w.json"]
        a.write_text("w.json", '{"weights": 2}')
        with pytest.raises(FingerprintMismatch, match="refused"):
            copy_between(a, "w.json", b, "w.json", expected=recorded)
        assert not b.exists("w.json")


def test_an_ssh_copy_without_rsync_names_the_package_before_anything_moves(no_rsync: None, tmp_path: Path) -> None:
    ssh = open_transport(Host(name="gpu-a", role="cuda", transport="ssh", address="192.0.2.1", user="u",
                              workdir="/w"))
    local = open_transport(_host(tmp_path, "a"))
    try:
        with pytest.raises(ConfigError, match=r"rsync is not installed.*gpu-a.*apt-get install rsync"):
            sender_for(local.files, ssh.files, "auto")
    finally:
        ssh.close()
        local.close()
