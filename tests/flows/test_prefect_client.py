"""What alignflow tells Prefect before importing it (its home, telemetry) and what it tells its own servers (the UI's
API URL): issue 40, "the Prefect UI of alignflow's own server cannot connect" and "writes ~/.prefect"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.prefect_client import prefect_environment, use_state_dir_for_prefect
from flows.server import server_env, ui_base


def test_an_owned_servers_ui_calls_that_servers_api_not_port_4200(tmp_path: Path) -> None:
    # Unset, Prefect derives the UI's API URL from PREFECT_SERVER_API_PORT (4200), not from `--port`.
    env = server_env(tmp_path, 51234, {"PREFECT_API_URL": "http://team:4200/api", "PREFECT_UI_API_URL": "x",
                                       "PREFECT_UI_URL": "http://team:4200", "PATH": "/bin"})
    assert env["PREFECT_SERVER_UI_API_URL"] == "http://127.0.0.1:51234/api"
    assert env["PREFECT_UI_URL"] == "http://127.0.0.1:51234/v2"
    assert "PREFECT_API_URL" not in env  # no other server's settings
    assert "PREFECT_UI_API_URL" not in env
    assert (env["PREFECT_SERVER_ANALYTICS_ENABLED"], env["DO_NOT_TRACK"]) == ("false", "1")
    assert env["PREFECT_HOME"] == str(tmp_path / "prefect" / "home")
    assert env["PATH"] == "/bin"
    assert ui_base("http://127.0.0.1:51234/api/") == "http://127.0.0.1:51234/v2"


def test_prefect_writes_under_the_state_dir_and_tracks_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    use_state_dir_for_prefect(tmp_path / "state", env)
    assert env == {"HOME": str(home), "PREFECT_HOME": str(tmp_path / "state" / "prefect" / "home"),
                   "DO_NOT_TRACK": "1"}
    assert (tmp_path / "state" / "prefect" / "home").is_dir()  # Prefect makes it as it is imported; it is ours


def test_what_the_user_set_stays_and_their_profiles_are_still_read(tmp_path: Path) -> None:
    assert prefect_environment(tmp_path, {"PREFECT_HOME": "/mine", "DO_NOT_TRACK": "0"}) == {}
    profiles = tmp_path / "home" / ".prefect" / "profiles.toml"
    profiles.parent.mkdir(parents=True)
    profiles.write_text('active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://team:4200/api"\n')
    updates = prefect_environment(tmp_path / "state", {"HOME": str(tmp_path / "home")})
    assert updates["PREFECT_PROFILES_PATH"] == str(profiles)  # a team server's profile still applies
    assert updates["PREFECT_HOME"] == str(tmp_path / "state" / "prefect" / "home")


CI_MARKERS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "BUILDKITE", "CI_NAME")  # Prefect mutes itself in CI


def _in_a_terminal(argv: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal as stdin, stdout and stderr (where Prefect shows its telemetry notice)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=300), b"".join(chunks).decode(errors="replace")


@pytest.mark.integration
def test_in_a_terminal_a_new_user_gets_no_telemetry_notice_and_nothing_in_their_home(
        tmp_path: Path, repo_root: Path, subprocess_env: dict[str, str]) -> None:
    home, workspace = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    (workspace / "experiments").mkdir(parents=True)
    shutil.copy(repo_root / "experiments" / "demo.yaml", workspace / "experiments")
    shutil.copy(repo_root / "hosts.yaml", workspace)
    env = {k: v for k, v in subprocess_env.items()
           if not k.startswith(("PREFECT_", "ALIGNFLOW_")) and k not in (*CI_MARKERS, "DO_NOT_TRACK", "MPLCONFIGDIR")}
    env["HOME"] = str(home)
    code, out = _in_a_terminal([sys.executable, "-m", "alignflow", "serve", "--dry-run"], cwd=workspace, env=env)
    assert code == 0, out
    assert "alignment/launch" in out  # it imported Prefect: the form's schema is Prefect's
    assert "anonymous usage" not in out  # Prefect's first-import notice
    assert list(home.iterdir()) == []  # no ~/.prefect (nor its .sdk_telemetry)
    assert (workspace / ".alignflow" / "prefect" / "home").is_dir()
