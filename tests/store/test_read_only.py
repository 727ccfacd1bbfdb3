"""A store that can only be read (an archived state dir, a read-only mount; issue 33): reading commands work on it,
a write is `StoreReadOnly` (exit 2) naming the store, never a traceback or SQLite's "unable to open database file"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from alignflow.errors import StoreReadOnly
from alignflow.store import Store, database
from tests.store.sample import CONFIG, CONFIG_SHA, run_params


def _recorded(path: Path) -> str:
    with Store.open(f"sqlite:///{path}") as store:
        store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
        return store.create_run("demo", trigger="cli", code_version="git:1234abcd",
                                params=run_params()).id


def test_a_store_whose_directory_cannot_be_written_is_read_and_refuses_writes_with_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state" / "store.sqlite"
    run_id = _recorded(path)
    assert not (tmp_path / "state" / "store.sqlite-wal").exists()  # closed cleanly: WAL's files are gone
    # root writes anywhere, so the permission probe answers as it would on a read-only mount
    monkeypatch.setattr(database, "read_only_file", lambda p: Path(p) == path)
    with Store.open(f"sqlite:///{path}") as store:
        assert [r.id for r in store.list_runs()] == [run_id]
        with pytest.raises(StoreReadOnly, match=r"store.sqlite: ensure experiment 'other': the store is read-only "
                                                r"\(attempt to write a readonly database\)") as caught:
            store.ensure_experiment("other", config=CONFIG, config_sha256=CONFIG_SHA)
    assert caught.value.exit_code == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["store.sqlite"]  # nothing written beside it


@pytest.mark.integration  # real `alignflow` processes, as a user who cannot write the state dir
def test_history_compare_and_export_read_a_read_only_state_dir(subprocess_env: dict[str, str]) -> None:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no user the state dir could refuse")
    root = Path(tempfile.mkdtemp(prefix="af-readonly-store-"))  # reachable by the other user, unlike tmp_path
    try:
        root.chmod(0o755)
        state = root / "state"
        run_id = _recorded(state / "store.sqlite")
        for path in (state, *state.rglob("*")):
            path.chmod(0o555 if path.is_dir() else 0o444)
        env = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(state), "HOME": str(root)}
        as_user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"] if os.geteuid() == 0 else []

        def alignflow(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*as_user, sys.executable, "-m", "alignflow", *args], capture_output=True,
                                  text=True, env=env, timeout=300, cwd=root)

        listed = alignflow("history")
        assert listed.returncode == 0, listed.stderr
        assert run_id in listed.stdout
        log = str(Path(__file__).resolve().parents[1] / "data" / "logs" / "mindspore_twin_demo_npu_reload.log")
        compared = alignflow("compare", log, log, "--out", str(state / "report"))
        assert compared.returncode == 2, compared.stdout + compared.stderr
        assert f"--out {state / 'report'}: {state} is not writable" in compared.stderr
        exported = alignflow("export", run_id, "--tensorboard", str(state / "tb"))
        assert exported.returncode == 1, exported.stdout + exported.stderr  # read from the store: nothing to export
        assert "no training metrics recorded" in exported.stderr
        assert "Traceback" not in listed.stderr + compared.stderr + exported.stderr
    finally:
        for path in root.rglob("*"):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)
