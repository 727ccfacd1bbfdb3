"""Issue 16, item 2: a workdir holding a newline is refused, never misread as another directory.

`/x/victim<newline>/x/victim` used to pass `validate`, and the transport, splitting `pwd -P` on newlines, then
worked in - and `remove()` deleted from - `/x/victim`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.config import load_hosts
from alignflow.config.hosts import Host
from alignflow.errors import ConfigError, TransportError
from alignflow.transport import open_transport

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x1b"], ids=["newline", "cr", "tab", "escape"])
def test_validate_refuses_a_control_character_in_a_workdir_with_file_and_line(
        tmp_path: Path, char: str, subprocess_env: dict[str, str]) -> None:
    hosts = tmp_path / "hosts.yaml"
    workdir = f"{tmp_path}/victim{char}{tmp_path}/victim"
    hosts.write_text('hosts:\n  cpu:\n    role: cpu\n    workdir: "' + workdir.encode("unicode_escape").decode()
                     + '"\n')
    with pytest.raises(ConfigError) as info:
        load_hosts(hosts)
    assert f"{hosts}:4: hosts.cpu.workdir:" in str(info.value)
    assert "control character" in str(info.value)
    done = subprocess.run([sys.executable, "-m", "alignflow", "validate", str(hosts)], capture_output=True,
                          text=True, env=subprocess_env, timeout=120)
    assert done.returncode != 0
    assert f"{hosts}:4:" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_the_transport_never_works_in_the_directory_before_a_newline(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A Host built without validation (as an old record might hold it) still cannot reach /x/victim."""
    if kind == "local":
        victim = tmp_path / "victim"
        base: dict[str, object] = {"name": "cpu", "role": "cpu", "transport": "local"}
    else:
        lab = request.getfixturevalue("ssh_lab")
        victim = lab.hosts["ascend"].home / "victim"
        base = lab.host("ascend").model_dump()
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    if kind == "ssh":
        import os
        os.chown(victim, lab.hosts["ascend"].uid, -1)
        os.chown(victim / "precious.txt", lab.hosts["ascend"].uid, -1)
    host = Host.model_construct(**{**base, "workdir": f"{victim}\n{victim}"})
    with open_transport(host) as t:
        with pytest.raises(TransportError, match="control character"):
            t.remove("precious.txt")
        with pytest.raises(TransportError, match="control character"):
            t.read_text("precious.txt")
    assert (victim / "precious.txt").read_text() == "keep me"
