"""`alignflow db upgrade | current | check` and `alignflow history` against SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.store import Store, database
from tests.lab.postgres import PostgresServer
from tests.store.sample import CONFIG, CONFIG_SHA, SHA_C, TickingClock, run_params

runner = CliRunner()


def _invoke(args: list[str], monkeypatch: pytest.MonkeyPatch, url: str) -> tuple[int, str, str]:
    monkeypatch.setenv("ALIGNFLOW_DB_URL", url)
    result = runner.invoke(app, args, env={"COLUMNS": "120"})  # the tables' width, whatever the terminal
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _populate(url: str) -> tuple[str, str]:
    with Store.open(url, clock=TickingClock()) as store:
        store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
        first = store.create_run("demo", trigger="cli", code_version="v1", params=run_params()).id
        step = store.start_step(first, "convert_bf16", host="cpu", command="convert", cache_key="k", inputs={})
        store.add_artifact(step.id, name="bf16_ckpt", host="cpu", path="out/bf16", kind="dir", sha256=SHA_C,
                           size_bytes=5 * 2**30)
        store.finish_step(step.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
        store.add_comparison(first, verdict="pass", criteria=[{"ok": True}], summary={})
        store.finish_run(first, status="completed", verdict="pass", report="reports/index.html")
        second = store.create_run("demo", parent_id=first, trigger="rerun", code_version="v2", params=run_params()).id
    return first, second


def test_db_upgrade_migrates_an_empty_database_and_reports_the_revision(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = _invoke(["db", "current"], monkeypatch, db_url)
    assert code == 0
    assert "revision: none (empty) (behind head" in out
    code, out, _ = _invoke(["db", "upgrade"], monkeypatch, db_url)
    head = database.head_revision()
    assert code == 0
    assert out.splitlines() == [f"database: {database.mask_url(db_url)}", f"upgraded: empty -> {head}",
                                f"revision: {head} (head)"]
    code, out, _ = _invoke(["db", "upgrade"], monkeypatch, db_url)
    assert (code, out.splitlines()[-1]) == (0, f"revision: {head} (head)")
    assert "upgraded" not in out
    code, out, _ = _invoke(["db", "check"], monkeypatch, db_url)
    assert (code, out.strip().endswith("models match the migrations")) == (0, True)


def test_db_check_fails_on_a_database_that_is_behind(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = _invoke(["db", "check"], monkeypatch, db_url)
    assert code == 1
    assert "run `alignflow db upgrade`" in err


@pytest.mark.integration
def test_db_upgrade_masks_the_password(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    database = postgres_server.create_database().rsplit("/", 1)[1]
    with_password = postgres_server.url(database, password="hunter2")  # trust auth accepts and ignores it
    code, out, _ = _invoke(["db", "upgrade"], monkeypatch, with_password)
    assert code == 0
    assert "hunter2" not in out
    assert out.splitlines()[0] == f"database: postgresql+psycopg://postgres:***@127.0.0.1:{postgres_server.port}/" \
                                  f"{database}"


def test_db_upgrade_defaults_to_sqlite_in_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALIGNFLOW_DB_URL", raising=False)
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "state"))
    result = runner.invoke(app, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "state" / "store.sqlite").is_file()
    assert f"database: sqlite:///{tmp_path / 'state' / 'store.sqlite'}" in result.stdout


def test_state_dir_defaults_to_dot_alignflow_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ALIGNFLOW_DB_URL", raising=False)
    monkeypatch.delenv("ALIGNFLOW_STATE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    assert (tmp_path / ".alignflow" / "store.sqlite").is_file()


def test_history_lists_runs_newest_first(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _populate(db_url)
    code, out, _ = _invoke(["history", "--json"], monkeypatch, db_url)
    assert code == 0
    rows = json.loads(out)
    assert [r["run_id"] for r in rows] == [second, first]
    assert rows[0]["parent_id"] == first
    assert rows[0]["trigger"] == "rerun"
    assert rows[0]["status"] == "running"
    assert rows[1]["verdict"] == "pass"
    assert rows[1]["duration_s"] > 0
    code, out, _ = _invoke(["history"], monkeypatch, db_url)
    assert code == 0
    lines = [line for line in out.splitlines() if first in line or second in line]
    assert lines[0].startswith(f"│ {second} │ demo")
    assert first in lines[0]
    assert "completed" in lines[1]
    assert "pass" in lines[1]
    code, out, _ = _invoke(["history", "--limit", "1", "--json", "--experiment", "demo"], monkeypatch, db_url)
    assert [r["run_id"] for r in json.loads(out)] == [second]


def test_history_of_one_run_is_show(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first, _ = _populate(db_url)
    code, out, _ = _invoke(["history", first[:6], "--json"], monkeypatch, db_url)
    assert code == 0
    detail = json.loads(out)
    assert detail == json.loads(_invoke(["show", first, "--json"], monkeypatch, db_url)[1])
    assert detail["run_id"] == first
    assert [s["step"] for s in detail["steps"]] == ["convert_bf16"]
    assert detail["steps"][0]["artifacts"][0]["sha256"] == SHA_C
    assert detail["verdict"] == "pass"
    code, out, _ = _invoke(["history", first], monkeypatch, db_url)
    assert code == 0
    assert "convert_bf16" in out
    assert "5.0 GiB" in out
    assert "verdict PASS" in out
    assert "reports/index.html" in out


@pytest.mark.integration
def test_history_of_an_unknown_experiment_or_run_fails_clearly(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "ALIGNFLOW_DB_URL": f"sqlite:///{tmp_path / 'store.sqlite'}"}
    _populate(env["ALIGNFLOW_DB_URL"])
    out = subprocess.run([sys.executable, "-m", "alignflow", "history", "--experiment", "nope"], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2  # a usage error
    assert "experiment 'nope': not in the store; recorded experiments: demo" in out.stderr
    out = subprocess.run([sys.executable, "-m", "alignflow", "history", "ffffffff"], env=env,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert "run 'ffffffff': no such id" in out.stderr


def test_history_on_an_empty_store_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Store.open(url).close()
    code, out, _ = _invoke(["history"], monkeypatch, url)
    assert code == 0
    assert out.startswith("no runs recorded in sqlite:///")


def test_history_does_not_create_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'state' / 'store.sqlite'}"
    code, out, _ = _invoke(["history"], monkeypatch, url)
    assert (code, out.strip()) == (0, f"no runs recorded: no store at {tmp_path / 'state' / 'store.sqlite'} yet")
    assert _invoke(["history", "--json"], monkeypatch, url)[:2] == (0, "[]\n")
    assert not (tmp_path / "state").exists()


@pytest.mark.slow
def test_db_upgrade_works_from_an_installed_wheel(repo_root: Path, tmp_path: Path) -> None:
    """The migrations must ship inside the package: build the wheel, install it elsewhere, migrate from there."""
    wheel_dir, target, source = tmp_path / "wheel", tmp_path / "site", tmp_path / "src"
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("alignflow", "tasks", "flows"):
        if (repo_root / name).is_dir():
            shutil.copytree(repo_root / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo_root / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheel_dir), str(source)], check=True, capture_output=True, text=True)
    [wheel] = wheel_dir.glob("alignflow-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ALIGNFLOW_DB_URL")}
    env.update(PYTHONPATH=str(target), ALIGNFLOW_STATE_DIR=str(tmp_path / "state"))
    out = subprocess.run([sys.executable, "-m", "alignflow", "db", "upgrade"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert f"revision: {database.head_revision()} (head)" in out.stdout
    probe = subprocess.run([sys.executable, "-c", "import alignflow.store, sys; print(alignflow.store.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert probe.stdout.startswith(str(target))  # the installed copy ran, not this checkout
