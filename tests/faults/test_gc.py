"""Issue 16, item 7: `alignflow gc` finds what no run references, lists it with sizes, and deletes it only when
asked - never anything a run's record references."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from alignflow.store import Store
from tests.store.sample import run_params

pytestmark = pytest.mark.integration

OLD = time.time() - 3 * 3600  # older than gc's default minimum age of one hour


def _make(path: Path, size: int, *, age: float | None = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    if age is not None:
        for p in (path, *path.parents[:3]):
            os.utime(p, (age, age))
    return path


@pytest.fixture
def env(tmp_path: Path, subprocess_env: dict[str, str]) -> tuple[Path, Path, dict[str, str]]:
    wd = tmp_path / "hosts" / "cpu"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"cpu": {"role": "cpu", "transport": "local", "workdir": str(wd)}}}))
    state = tmp_path / "state"
    env = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(state), "ALIGNFLOW_HASH_MEMO": str(tmp_path / "m.sqlite")}
    return wd, hosts, env


def _record_run(state: Path, wd: Path) -> None:
    """A run whose records name one output, one job dir and one staged input (in its command)."""
    with Store.open(state_dir=state) as store:
        store.ensure_experiment("e", config={"a": 1}, config_sha256="0" * 64)
        run = store.create_run("e", trigger="test", code_version="v", params=run_params("e"), config_sha256="0" * 64)
        step = store.start_step(run.id, "convert_bf16", host="cpu",
                                command=f"python -m alignflow convert bf16 {wd}/inputs/base-kept {wd}/artifacts/"
                                f"convert_bf16/kept/bf16", cache_key="k", inputs={})
        store.attach_job(step.id, job_dir=f"{wd}/jobs/kept-job", handle={"out": f"{wd}/artifacts/convert_bf16/kept"})
        store.add_artifact(step.id, name="bf16_ckpt", host="cpu", path=f"{wd}/artifacts/convert_bf16/kept/bf16",
                           kind="dir", sha256="1" * 64, size_bytes=3)
        store.finish_step(step.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
        store.finish_run(run.id, status="completed")


def _gc(hosts: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", "gc", "--hosts", str(hosts), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_gc_lists_unreferenced_artifacts_with_sizes_and_deletes_only_them_when_asked(env) -> None:  # type: ignore[no-untyped-def]
    wd, hosts, environ = env
    kept = [_make(wd / "artifacts/convert_bf16/kept/bf16/w.bin", 3),
            _make(wd / "inputs/base-kept/w.bin", 5),
            _make(wd / "jobs/kept-job/stdout", 7)]
    garbage = {"artifacts/convert_bf16/old": _make(wd / "artifacts/convert_bf16/old/bf16/w.bin", 1000),
               "inputs/data-0123": _make(wd / "inputs/data-0123", 2000),
               "jobs/old-job": _make(wd / "jobs/old-job/stdout", 30),
               "inputs/.af-partial-data-x-1a2b3c4d-deadbeef": _make(
                   wd / "inputs/.af-partial-data-x-1a2b3c4d-deadbeef/payload/w.bin", 400),
               "artifacts/convert_bf16/kept/.bf16.ab12cd34.partial": _make(
                   wd / "artifacts/convert_bf16/kept/.bf16.ab12cd34.partial/w.bin", 50)}
    young = _make(wd / "artifacts/npu_base_train/just-started/log", 9, age=None)
    _record_run(Path(environ["ALIGNFLOW_STATE_DIR"]), wd)

    dry = _gc(hosts, environ, "--json")
    assert dry.returncode == 0, dry.stderr
    listed = json.loads(dry.stdout)
    assert {g["path"]: g["size_bytes"] for g in listed["garbage"]} == {
        str(wd / rel): path.stat().st_size for rel, path in garbage.items()}
    assert listed["deleted"] is None
    assert all(p.exists() for p in [*garbage.values(), *kept, young])  # a dry run deletes nothing
    table = _gc(hosts, environ)
    assert "would free" in table.stdout
    assert "--delete" in table.stdout
    assert str(wd / "inputs/data-0123") in table.stdout

    done = _gc(hosts, environ, "--delete", "--json")
    assert done.returncode == 0, done.stderr
    assert {g["path"] for g in json.loads(done.stdout)["deleted"]} == {str(wd / rel) for rel in garbage}
    assert not any((wd / rel).exists() for rel in garbage)
    assert all(p.exists() for p in [*kept, young])
    assert json.loads(_gc(hosts, environ, "--json").stdout)["garbage"] == []


def test_gc_without_the_runs_store_refuses_instead_of_calling_everything_garbage(env) -> None:  # type: ignore[no-untyped-def]
    wd, hosts, environ = env
    output = _make(wd / "artifacts/convert_bf16/someone-elses/bf16/w.bin", 10)
    done = _gc(hosts, environ, "--delete")
    assert done.returncode == 2
    assert "no store at" in done.stderr
    assert "Traceback" not in done.stderr
    with Store.open(state_dir=Path(environ["ALIGNFLOW_STATE_DIR"])):
        pass  # an empty store: it records no run, so it cannot tell garbage from someone's artifacts
    done = _gc(hosts, environ, "--delete")
    assert done.returncode == 2
    assert "records no run" in done.stderr
    assert output.exists()


def test_gc_collects_a_dead_writers_staging_whatever_its_age_and_keeps_a_live_ones(env) -> None:  # type: ignore[no-untyped-def]
    """Issue 33: a staging directory with an owner marker is garbage exactly when its writer is dead (decided on
    the host by the marker's identity), even a minute old; a live writer's is kept, even a day old."""
    from alignflow import controller
    from alignflow.staging import MARKER

    wd, hosts, environ = env
    me = controller.current().to_dict()
    dead = _make(wd / "artifacts/convert_bf16/kept/.mg.abcd1234.partial/w.bin", 60, age=None)
    (dead.parent / MARKER).write_text(json.dumps({"owner": {**me, "pid": 2**22 + 3, "start_ticks": 1},
                                                  "purpose": "convert megatron"}))
    live = _make(wd / "artifacts/convert_bf16/kept/.mf.abcd1234.partial/w.bin", 70)
    (live.parent / MARKER).write_text(json.dumps({"owner": me, "purpose": "convert mindformers"}))
    os.utime(live.parent, (OLD, OLD))
    _record_run(Path(environ["ALIGNFLOW_STATE_DIR"]), wd)
    listed = _gc(hosts, environ, "--json")
    assert listed.returncode == 0, listed.stderr
    (garbage,) = json.loads(listed.stdout)["garbage"]
    assert garbage["path"] == str(dead.parent)
    assert "convert megatron (pid" in garbage["why"]
    assert "is dead" in garbage["why"]
    done = _gc(hosts, environ, "--delete")
    assert done.returncode == 0, done.stderr
    assert not dead.parent.exists()
    assert live.exists()
