"""Runs whose controller died are marked interrupted (never left running); nothing recorded is lost (both backends)."""

from __future__ import annotations

import signal
import subprocess
from dataclasses import replace

import pytest
from alembic import command
from sqlalchemy import text

from alignflow import controller
from alignflow.errors import ImmutableRecord
from alignflow.store import RunStatus, StepStatus, Store
from alignflow.store import database as db
from alignflow.store.interruptions import INTERRUPTED_STEP, reconcile
from tests.store.sample import BASE, CONFIG, CONFIG_SHA, TickingClock, run_params


@pytest.fixture
def sleeper() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc  # type: ignore[misc]
    proc.kill()
    proc.wait()


def _run_driven_by(db_url: str, ident: controller.ControllerIdentity) -> tuple[Store, str, str]:
    store = Store.open(db_url, clock=TickingClock(), controller=ident.to_dict)
    store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    run = store.create_run("demo", trigger="cli", code_version="test", params=run_params())
    done = store.start_step(run.id, "npu_base_train", host="ascend", command="train", cache_key="k1", inputs={})
    store.finish_step(done.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    open_step = store.start_step(run.id, "convert_bf16", host="cpu", command="convert", cache_key="k2",
                                 inputs={"base_ckpt": BASE})
    store.attach_job(open_step.id, job_dir="/w/cpu/jobs/j1", handle={"host": "cpu", "job_dir": "/w/cpu/jobs/j1"})
    return store, run.id, open_step.id


def test_a_run_records_the_process_that_drives_it(db_url: str) -> None:
    with Store.open(db_url) as store:
        store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
        run = store.create_run("demo", trigger="cli", code_version="test", params=run_params())
        assert run.controller == controller.current().to_dict()
        assert store.get_run(run.id).controller == run.controller


@pytest.mark.integration  # a real process plays the controller
def test_a_run_whose_controller_was_killed_is_marked_interrupted_with_its_job(
        db_url: str, sleeper: subprocess.Popen[bytes]) -> None:
    ident = controller.current(pid=sleeper.pid)
    store, run_id, step_id = _run_driven_by(db_url, ident)
    try:
        assert reconcile(store).interrupted == []  # alive: untouched
        assert store.get_run(run_id).status == RunStatus.RUNNING
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        result = reconcile(store)
        assert [i.run.id for i in result.interrupted] == [run_id]
        assert [j.job_dir for j in result.interrupted[0].jobs] == ["/w/cpu/jobs/j1"]
        run = store.get_run(run_id)
        assert run.status == RunStatus.INTERRUPTED
        assert f"pid {sleeper.pid}" in (run.error or "")
        steps = {s.step: s for s in store.steps(run_id)}
        assert steps["npu_base_train"].status == StepStatus.RAN  # finished work is kept as it was
        assert steps["convert_bf16"].status == StepStatus.FAILED
        assert (steps["convert_bf16"].error or "").startswith(INTERRUPTED_STEP)
        assert "/w/cpu/jobs/j1" in (steps["convert_bf16"].error or "")
        assert store.get_step(step_id).job_dir == "/w/cpu/jobs/j1"
        assert reconcile(store).interrupted == []  # once
    finally:
        store.close()


@pytest.mark.integration  # a real process plays the controller
def test_a_zombie_controller_is_dead(sleeper: subprocess.Popen[bytes]) -> None:
    ident = controller.current(pid=sleeper.pid)
    sleeper.send_signal(signal.SIGKILL)  # not reaped yet: /proc still lists it, in state Z
    for _ in range(100):
        if controller.liveness(ident) == "dead":
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert controller.liveness(ident) == "dead"


@pytest.mark.integration  # a real process plays the controller
def test_a_reused_pid_or_a_reboot_means_the_controller_is_gone(sleeper: subprocess.Popen[bytes]) -> None:
    ident = controller.current(pid=sleeper.pid)
    assert controller.liveness(ident) == "alive"
    assert ident.start_ticks is not None
    assert controller.liveness(replace(ident, start_ticks=ident.start_ticks - 1)) == "dead"
    assert controller.liveness(replace(ident, boot_id="another-boot")) == "dead"
    assert controller.liveness(replace(ident, host="elsewhere")) == "unknown"


def test_a_controller_on_another_host_is_left_alone_and_reported(db_url: str) -> None:
    ident = replace(controller.current(), host="other-controller")
    store, run_id, _ = _run_driven_by(db_url, ident)
    try:
        result = reconcile(store)
        assert result.interrupted == []
        assert [u.run.id for u in result.unverifiable] == [run_id]
        assert "other-controller" in result.unverifiable[0].reason
        assert store.get_run(run_id).status == RunStatus.RUNNING
    finally:
        store.close()


def test_an_interrupted_run_can_be_cancelled_once_and_keeps_why_it_was_interrupted(db_url: str) -> None:
    store, run_id, _ = _run_driven_by(db_url, controller.current())
    try:
        assert store.interrupt_run(run_id, reason="test: controller gone") is not None
        assert store.interrupt_run(run_id, reason="again") is None
        cancelled = store.cancel_interrupted(run_id, note="killed 1 job")
        assert cancelled.status == RunStatus.CANCELLED
        assert "test: controller gone" in (cancelled.error or "")
        assert "killed 1 job" in (cancelled.error or "")
        with pytest.raises(ImmutableRecord, match="not interrupted"):
            store.cancel_interrupted(run_id, note="twice")
    finally:
        store.close()


def test_upgrading_a_store_from_before_keeps_its_runs_and_accepts_interrupted(db_url: str) -> None:
    engine = db.create_store_engine(db_url)
    try:
        with engine.begin() as conn:
            command.upgrade(db.alembic_config(conn), "0002")  # the revision before controllers were kept
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO experiments (id, name, created_at) VALUES (1, 'demo', '2026-01-01')"))
            conn.execute(text("INSERT INTO experiment_configs (id, experiment_id, sha256, config, created_at) "
                              "VALUES (1, 1, :sha, '{}', '2026-01-01')"), {"sha": CONFIG_SHA})
            conn.execute(text("INSERT INTO runs (id, experiment_id, config_id, trigger, status, code_version, params,"
                              " started_at) VALUES ('0123456789ab', 1, 1, 'cli', 'running', 'old', '{}', "
                              "'2026-01-01')"))
    finally:
        engine.dispose()
    with Store.open(db_url) as store:
        old = store.get_run("0123456789ab")
        assert (old.status, old.controller) == (RunStatus.RUNNING, None)
        assert [u.run.id for u in reconcile(store).unverifiable] == [old.id]  # no controller: not guessed at
        assert store.interrupt_run(old.id, reason="test") is not None
        assert store.get_run(old.id).status == RunStatus.INTERRUPTED
