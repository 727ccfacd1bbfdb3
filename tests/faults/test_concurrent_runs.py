"""Many runs at once on a fresh state dir: everything they share is created once, and none fails because another one
started beside it (issue 49).

N runs (4 in `make test`; ALIGNFLOW_CONCURRENT_RUNS=8 for more) of a mix of two experiments that share their data
and their trainings - tests/data/flow/tiny.yaml and a copy of it under another name, as the shipped demos share
`data/demo` - are started within a second of each other on the three local hosts, each a process of its own: it
imports, says it is ready, and starts when every one is. Then:

- every run completes with its verdict (pass);
- the data is created once (one `created the data` line in all their output) and each job step of the pipeline runs
  once (one step run `ran` per step in the store, the others `cached` from it); the waits are said and counted;
- the store (created by all of them at once on the fresh state dir; or, as the team runs it, an empty PostgreSQL
  database they all migrate at once) passes SQLite's integrity check and `alignflow db check`, and holds every
  run, none left `running`.

A variant kills the creator of the data with SIGKILL while it writes it, another run waiting on it: the waiting run
creates the data and completes.

Each run is `start_run` + `execute_pipeline`, the Prefect-free walker: the flow's data task and step tasks call the
same `run_inputs` and `run_step` (tasks/steps.py), and a Prefect server per run would cost more than the runs.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from alignflow.store import RunStatus, Store
from alignflow.store.interruptions import reconcile
from tests.flows.conftest import make_flow_env

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RUNS = int(os.environ.get("ALIGNFLOW_CONCURRENT_RUNS", "4"))
JOB_STEPS = ("npu_base_train", "convert_bf16", "convert_megatron", "npu_reload_train", "gpu_train")

# argv: experiment, hosts, state dir. Imports, says "ready", starts its run at the "go" line on stdin; every event
# is a line of its stdout, the last one `RESULT {json}`.
_RUN = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from alignflow.runner.run import execute_pipeline, start_run
    from alignflow.store import Store
    from alignflow.transport import open_transport
    import alignflow.twin.data, alignflow.fingerprint  # what the data needs, imported before the start

    experiment, hosts, state = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.time()
    say = lambda m: print(m, flush=True)
    with Store.open(state_dir=state, upgrade=True) as store:
        run_id = start_run(experiment, hosts, store=store, state_dir=state)
        say(f"run {run_id}")
        view = execute_pipeline(run_id, store=store, state_dir=state, transport_factory=open_transport, events=say)
    say("RESULT " + json.dumps({"run": run_id, "status": str(view.status), "verdict": view.verdict,
                                "began": began, "ended": time.time(), "error": view.error}))
""")


@dataclass
class Run:
    proc: subprocess.Popen[str]
    out: Path

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines()

    def result(self) -> dict[str, object]:
        found = [json.loads(line[len("RESULT "):]) for line in self.lines() if line.startswith("RESULT ")]
        assert found, f"no result; its output:\n{self.out.read_text()}\n{self.out.with_suffix('.err').read_text()}"
        result: dict[str, object] = found[0]
        return result


def _start(experiment: Path, env_root: Path, state: Path, out: Path, environ: dict[str, str]) -> Run:
    with open(out, "w") as stdout, open(out.with_suffix(".err"), "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", _RUN, str(experiment), str(env_root / "hosts.yaml"), str(state)],
                                stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, text=True, cwd=env_root,
                                env=environ)
    return Run(proc, out)


def _wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _ready(run: Run) -> bool:
    assert run.proc.poll() is None, run.out.with_suffix(".err").read_text()
    return "ready" in run.lines()


def _go(*runs: Run) -> None:
    for run in runs:
        assert run.proc.stdin is not None
        run.proc.stdin.write("go\n")
        run.proc.stdin.close()


def _finish(runs: list[Run], timeout_s: float) -> None:
    for run in runs:
        try:
            run.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            run.proc.kill()
            raise


def _being_written(data: Path) -> bool:
    """A hidden directory beside `data/big`: its data being written (a staging directory)."""
    return data.is_dir() and any(p.name.startswith(".big.") and p.is_dir() for p in data.iterdir())


def _store_is_whole(state: Path, environ: dict[str, str]) -> None:
    """SQLite's own integrity check (on SQLite), then `alignflow db check`: the schema at head, the models its."""
    if "ALIGNFLOW_DB_URL" not in environ:
        with sqlite3.connect(state / "store.sqlite") as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    check = subprocess.run([sys.executable, "-m", "alignflow", "db", "check"], capture_output=True, text=True,
                           env=environ, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture
def workspace(tmp_path: Path, repo_root: Path, subprocess_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    env = make_flow_env(tmp_path / "ws", repo_root)
    doc = yaml.safe_load(env.experiment.read_text())
    doc["data"] = {"path": "data/demo", "prefix": "demo", "generate": {"tokens": 131072, "seed": 7}}  # the demos'
    env.experiment.write_text(yaml.safe_dump(doc, sort_keys=False))
    (env.root / "tiny-b.yaml").write_text(yaml.safe_dump({**doc, "name": "tiny-b"}, sort_keys=False))
    environ = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(env.state), "OMP_NUM_THREADS": "1", "GLOG_v": "3"}
    return env.root, environ


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_runs_started_together_share_what_they_create_and_all_complete(
        workspace: tuple[Path, dict[str, str]], tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    root, environ = workspace
    state = root / "state"
    if store == "postgresql":  # the team's store: a fresh, empty database that every run migrates at once
        environ = {**environ, "ALIGNFLOW_DB_URL": str(request.getfixturevalue("postgres_url"))}
    experiments = [root / ("tiny.yaml" if i % 2 == 0 else "tiny-b.yaml") for i in range(RUNS)]
    runs = [_start(e, root, state, tmp_path / f"run{i}.out", environ) for i, e in enumerate(experiments)]
    try:
        _wait_for(lambda: all(_ready(r) for r in runs), 120, "the runs to import")
        _go(*runs)
        _finish(runs, 600)
    finally:
        for run in runs:
            run.proc.kill()
            run.proc.wait()
    results = [r.result() for r in runs]
    lines = [line for r in runs for line in r.lines()]
    began = [float(r["began"]) for r in results]  # type: ignore[arg-type]
    spread_s = max(began) - min(began)
    waits = [line for line in lines if line.startswith("waiting for ")]
    launched = Counter(line.split(":")[0] for line in lines if ": launched on " in line)
    print(f"{RUNS} runs, started {spread_s:.3f} s apart, {len(waits)} waits:", *waits, sep="\n  ")
    assert spread_s < 1.0
    assert [(r["status"], r["verdict"]) for r in results] == [("completed", "pass")] * RUNS, results
    assert launched == dict.fromkeys(JOB_STEPS, 1)
    created = [line for line in lines if line.startswith("created ")]
    assert created == [f"created the data demo: {root}/data/demo"]
    with Store.open(environ.get("ALIGNFLOW_DB_URL"), state_dir=state) as opened:
        recorded = opened.list_runs(limit=100)
        assert sorted(r.id for r in recorded) == sorted(str(r["run"]) for r in results)
        assert {r.status for r in recorded} == {RunStatus.COMPLETED}
        statuses = Counter((s.step, str(s.status)) for r in recorded for s in opened.steps(r.id))
    for step in JOB_STEPS:  # each training and conversion ran once; every other run reused it
        assert (statuses[(step, "ran")], statuses[(step, "cached")]) == (1, RUNS - 1), statuses
    assert statuses[("compare", "ran")] == RUNS  # each run's own verdict
    assert waits  # the trainings take seconds: the other runs waited for them, saying for whom
    assert all(" (run " in w and w.endswith(" is creating it)") for w in waits)
    assert sorted(p.name for p in (root / "data").iterdir()) == [".demo.lock", "demo"]
    _store_is_whole(state, environ)


def test_a_creator_killed_mid_creation_leaves_the_next_run_to_create_it_and_complete(
        workspace: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, environ = workspace
    state = root / "state"
    doc = yaml.safe_load((root / "tiny.yaml").read_text())
    doc["data"] = {**doc["data"], "path": "data/big", "generate": {"tokens": 1_500_000, "seed": 7}}  # ~3 s to write
    (root / "big.yaml").write_text(yaml.safe_dump({**doc, "name": "big"}, sort_keys=False))
    creator = _start(root / "big.yaml", root, state, tmp_path / "creator.out", environ)
    waiter = _start(root / "big.yaml", root, state, tmp_path / "waiter.out", environ)
    try:
        _wait_for(lambda: _ready(creator) and _ready(waiter), 120, "the runs to import")
        _go(creator)
        data = root / "data"
        _wait_for(lambda: _being_written(data), 120, "the creator to write the data")
        (creator_run,) = [line.split()[1] for line in creator.lines() if line.startswith("run ")]
        _go(waiter)
        _wait_for(lambda: f"waiting for the data big (run {creator_run} is creating it)" in waiter.lines(), 60,
                  "the second run to wait for the creator")
        assert _being_written(data)  # still writing: the kill lands mid-creation
        creator.proc.send_signal(signal.SIGKILL)
        creator.proc.wait(30)
        _finish([waiter], 600)
    finally:
        for run in (creator, waiter):
            run.proc.kill()
            run.proc.wait()
    result = waiter.result()
    print(f"creator run {creator_run} killed mid-creation; the next run: {result}")
    assert (result["status"], result["verdict"]) == ("completed", "pass"), result
    assert f"created the data big: {data}/big" in waiter.lines()
    assert sorted(p.name for p in data.iterdir()) == [".big.lock", "big"]  # the dead creator's staging swept
    with Store.open(state_dir=state) as store:
        reconcile(store)  # what the next command does: the killed controller's run is interrupted, not running
        recorded = {r.id: r.status for r in store.list_runs(limit=100)}
    assert recorded == {creator_run: RunStatus.INTERRUPTED, str(result["run"]): RunStatus.COMPLETED}
    _store_is_whole(state, environ)
