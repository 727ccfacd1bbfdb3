"""Fixtures: the same behavioural tests run against a local host and against an SSH host of the lab."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from alignflow.config.hosts import Host
from alignflow.transport import Transport, open_transport
from tests.lab.sshd import SSHLab

MakeTransport = Callable[..., Transport]


@pytest.fixture(params=["local", "ssh"])
def make_transport(request: pytest.FixtureRequest, tmp_path: Path, subprocess_env: dict[str, str]) -> Iterator[
        MakeTransport]:
    """`make_transport(**host_overrides)`: a transport to a fresh host of the parametrized kind."""
    opened: list[Transport] = []

    def make(**overrides: Any) -> Transport:
        if request.param == "local":
            fields: dict[str, Any] = {"name": "local-cpu", "role": "cpu", "transport": "local",
                                      "workdir": str(tmp_path / "wd"),
                                      "env": {"PYTHONPATH": subprocess_env["PYTHONPATH"]}}
            host = Host(**{**fields, **overrides})
        else:
            lab: SSHLab = request.getfixturevalue("ssh_lab")
            host = lab.host("ascend", **overrides)
        t = open_transport(host)
        opened.append(t)
        return t

    yield make
    for t in opened:
        t.close()


@pytest.fixture
def transport(make_transport: MakeTransport) -> Transport:
    return make_transport()


@pytest.fixture
def area() -> str:
    """A fresh relative directory name: lab hosts are shared by the session's tests."""
    return f"t-{secrets.token_hex(4)}"


@pytest.fixture(autouse=True)
def _controller_memo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """put/get hash controller files with the controller's memo: keep it out of the real home."""
    monkeypatch.setenv("ALIGNFLOW_HASH_MEMO", str(tmp_path / "controller-memo.sqlite"))
