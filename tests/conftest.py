"""Shared pytest fixtures.

Integration fixtures (real sshd lab hosts, a real PostgreSQL server, one Prefect harness per session) live in
`tests/lab/` modules and are imported here so that every test module can request them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.lab.sshd import SSHLab

REPO_ROOT = Path(__file__).resolve().parent.parent

# Lab fixtures with real processes: `postgres_server` (session), `postgres_url` (an empty database per test).
pytest_plugins = ["tests.lab.postgres"]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for child processes that must import *this* checkout's alignflow."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def ssh_lab() -> Iterator[SSHLab]:
    """Real sshd servers on 127.0.0.11/.12/.13 (lab hosts ascend, cpu, cuda), one Unix user each.

    Needs root; fails (never skips) without it, because these tests must run in CI.
    """
    from tests.lab.sshd import LabUnavailable, SSHLab

    try:
        lab = SSHLab.start()
    except LabUnavailable as exc:
        pytest.fail(f"SSH lab unavailable: {exc}")
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="session")
def lab_hosts_yaml(ssh_lab: SSHLab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hosts.yaml describing the SSH lab's three hosts."""
    return ssh_lab.write_hosts_yaml(tmp_path_factory.mktemp("lab") / "hosts.yaml")
