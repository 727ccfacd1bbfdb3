"""A state directory alignflow cannot write (issue 33): a clear error naming it, exit 2, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.errors import ConfigError
from alignflow.state import writable_dir


def test_a_directory_that_cannot_be_made_is_a_config_error_naming_where(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file where the state dir should be")
    with pytest.raises(ConfigError, match=r"state: cannot write there: Not a directory") as caught:
        writable_dir(tmp_path / "state" / "prefect" / "home")
    assert caught.value.exit_code == 2
    assert "ALIGNFLOW_STATE_DIR" in str(caught.value)


def _as_unprivileged(argv: list[str]) -> list[str]:
    """Root writes anywhere: a read-only state dir only refuses an ordinary user (nobody, through setpriv)."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no user the state dir could refuse")
    return ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *argv]


@pytest.mark.integration  # a real `alignflow run`, as a user who cannot write the state dir
@pytest.mark.parametrize("holds_a_store", [False, True])
def test_run_with_a_read_only_state_dir_names_it_and_exits_2(repo_root: Path, subprocess_env: dict[str, str],
                                                             holds_a_store: bool) -> None:
    import tempfile

    # pytest's own tmp_path sits under a 0700 directory of the user running pytest: the other user could not
    # even reach it. A directory of its own in the system's temporary directory, removed at the end.
    root = Path(tempfile.mkdtemp(prefix="af-readonly-"))
    try:
        root.chmod(0o755)
        _run_read_only(root, repo_root, subprocess_env, holds_a_store)
    finally:
        for path in root.rglob("*"):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)


def _run_read_only(root: Path, repo_root: Path, subprocess_env: dict[str, str], holds_a_store: bool) -> None:
    home, state = root / "home", root / "state"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    state.mkdir()
    if holds_a_store:
        done = subprocess.run([sys.executable, "-m", "alignflow", "db", "upgrade"], capture_output=True, text=True,
                              env={**subprocess_env, "ALIGNFLOW_STATE_DIR": str(state)}, timeout=300)
        assert done.returncode == 0, done.stderr
    for path in (state, *state.rglob("*")):
        path.chmod(0o555 if path.is_dir() else 0o444)
    env = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(state), "HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(_as_unprivileged([sys.executable, "-m", "alignflow", "run", "experiments/demo.yaml"]),
                          cwd=repo_root, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert f"error: {state}: cannot write there" in done.stderr
    assert "ALIGNFLOW_STATE_DIR" in done.stderr
