"""Fixtures of the fault suite: a host (local, or the SSH lab's `ascend` over real sshd) with a place outside its
workdir that the host's user can read, so an escape would succeed if alignflow let it."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from alignflow.config.hosts import Host
from alignflow.transport import Transport, open_transport
from tests.lab.sshd import SSHLab

SECRET = b"PRIVATE KEY MATERIAL of the host user - must never leave its home\n"


@dataclass
class Site:
    """One host as the tests see it: its transport, a fresh area in its workdir, and a directory outside it.

    Paths are local paths of this machine (the lab's hosts are loopback sshd servers with their own users), so
    a test can plant files where the host's user owns them and check what changed afterwards.
    """

    kind: str
    t: Transport
    workdir: Path
    area: str  # relative to the workdir
    outside: Path
    uid: int = -1
    gid: int = -1
    opened: list[Transport] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.workdir / self.area

    def own(self, *paths: Path) -> None:
        """Give what the test created to the host's user (the lab's users cannot read root's files)."""
        if self.uid < 0:
            return
        for p in paths:
            for dirpath, dirnames, filenames in os.walk(p) if p.is_dir() and not p.is_symlink() else [("", [], [])]:
                for name in dirnames + filenames:
                    os.lchown(os.path.join(dirpath, name), self.uid, self.gid)
            os.lchown(p, self.uid, self.gid)

    def write(self, rel: str, data: bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.own(*self._created(path))
        return path

    def link(self, rel: str, target: str | Path) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        self.own(*self._created(path))
        return path

    def _created(self, path: Path) -> list[Path]:
        out, p = [path], path.parent
        while p != self.workdir and self.workdir in p.parents:
            out.append(p)
            p = p.parent
        return out

    def another(self, **overrides: Any) -> Transport:
        """A second transport to the same host (what a second controller holds)."""
        t = open_transport(self.t.host.model_copy(update=overrides))
        self.opened.append(t)
        return t

    def outside_snapshot(self) -> dict[str, bytes]:
        """Every file outside the workdir that the test planted, with its content (to prove nothing changed)."""
        return {str(p): p.read_bytes() for p in sorted(self.outside.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(params=["local", "ssh"])
def site(request: pytest.FixtureRequest, tmp_path: Path, subprocess_env: dict[str, str],
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    """A host of the parametrized kind, a fresh area in its workdir and a secret outside it."""
    monkeypatch.setenv("ALIGNFLOW_HASH_MEMO", str(tmp_path / "controller-memo.sqlite"))
    area = f"f-{secrets.token_hex(4)}"
    if request.param == "local":
        host = Host(name="local-cpu", role="cpu", transport="local", workdir=str(tmp_path / "wd"),
                    env={"PYTHONPATH": subprocess_env["PYTHONPATH"]})
        outside = tmp_path / "outside"
        outside.mkdir()
        s = Site("local", open_transport(host), tmp_path / "wd", area, outside)
    else:
        lab: SSHLab = request.getfixturevalue("ssh_lab")
        lab_host = lab.hosts["ascend"]
        outside = lab_host.home / f"outside-{area}"
        outside.mkdir()
        s = Site("ssh", open_transport(lab.host("ascend")), lab_host.workdir, area, outside, lab_host.uid,
                 os.stat(lab_host.home).st_gid)
    (outside / "private.txt").write_bytes(SECRET)
    (outside / "keys").mkdir()
    (outside / "keys" / "id_ed25519").write_bytes(SECRET * 3)
    s.own(outside)
    s.t.mkdir(area)
    try:
        yield s
    finally:
        for t in (s.t, *s.opened):
            t.close()
        if s.kind == "ssh":
            shutil.rmtree(outside, ignore_errors=True)
            shutil.rmtree(s.root, ignore_errors=True)


def tree_bytes(root: Path) -> list[bytes]:
    """The content of every regular file below `root` (links not followed): to prove a secret never arrived."""
    if root.is_file():
        return [root.read_bytes()]
    return [p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def staging_leftovers(directory: Path) -> list[str]:
    """Names a copy or conversion stages under (`.af-partial-*`, `.*.partial`) left in `directory`."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".af-partial-")
                  or (p.name.startswith(".") and p.name.endswith(".partial")))
