"""Shared pytest fixtures.

Integration fixtures (real sshd lab hosts, a real PostgreSQL server, one Prefect harness per session) live in
`tests/lab/` modules and are imported here so that every test module can request them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

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
