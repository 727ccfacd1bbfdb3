"""`alignflow doctor`: every problem of this machine and of each host in one table, exit 1; a ready machine exits 0.

The hosts are real: local hosts run the probe through their transport like an SSH host would; a missing tool is
missing for real (a PATH holding every tool of this machine but those), an SSH host that does not answer is a
port nothing listens on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration  # real processes: the command line, hosts' commands


def _path_without(tmp_path: Path, *missing: str) -> str:
    tools = tmp_path / "bin"
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if tool.name not in missing and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    return str(tools)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _doctor(tmp_path: Path, env: dict[str, str], hosts: dict[str, object]) -> tuple[int, dict[str, object]]:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts}))
    done = subprocess.run([sys.executable, "-m", "alignflow", "doctor", "--hosts", str(path), "--json",
                           "--min-free-gib", "0"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert "Traceback" not in done.stderr
    return done.returncode, json.loads(done.stdout)


def _problems(doc: dict[str, object]) -> dict[tuple[str, str], str]:
    return {(c["where"], c["what"]): c["detail"] for c in doc["checks"] if not c["ok"]}  # type: ignore[attr-defined,index]


@pytest.fixture
def env(tmp_path: Path, subprocess_env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in subprocess_env.items() if not k.startswith("PREFECT_API")}
    return {**base, "ALIGNFLOW_STATE_DIR": str(tmp_path / "state")}


LOCAL = {name: {"role": name, "transport": "local", "workdir": f"hosts/{name}"} for name in ("ascend", "cpu", "cuda")}


def test_the_embedded_default_is_ready_here(tmp_path: Path, env: dict[str, str]) -> None:
    code, doc = _doctor(tmp_path, env, LOCAL)
    assert code == 0, _problems(doc)
    assert doc["ok"] is True
    wheres = {c["where"] for c in doc["checks"]}  # type: ignore[attr-defined]
    assert wheres == {"controller", "ascend", "cpu", "cuda"}


def test_a_machine_without_flock_or_rsync_gets_every_problem_listed(tmp_path: Path, env: dict[str, str]) -> None:
    env["PATH"] = _path_without(tmp_path, "flock", "rsync")
    code, doc = _doctor(tmp_path, env, LOCAL)
    assert code == 1
    problems = _problems(doc)
    assert set(problems) == {("ascend", "flock"), ("cpu", "flock"), ("cuda", "flock")}  # rsync: not needed locally
    assert "install `util-linux`" in problems[("cpu", "flock")]


def test_an_ssh_host_that_does_not_answer_and_what_ssh_hosts_need(tmp_path: Path, env: dict[str, str]) -> None:
    env["PATH"] = _path_without(tmp_path, "rsync")
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{_free_port()}/api"
    hosts = {**LOCAL, "gpu-a": {"role": "cuda", "transport": "ssh", "address": "127.0.0.1", "port": _free_port(),
                                "user": "nobody", "workdir": "/tmp/x", "connect_timeout_s": 5}}
    code, doc = _doctor(tmp_path, env, hosts)
    assert code == 1
    problems = _problems(doc)
    assert set(problems) == {("controller", "rsync"), ("controller", "prefect"), ("gpu-a", "reachable")}
    assert "install `rsync`" in problems[("controller", "rsync")]
    assert "does not answer" in problems[("controller", "prefect")]
