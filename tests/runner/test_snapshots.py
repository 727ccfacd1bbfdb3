"""Host snapshots of a run: taken once per host and recorded; several hosts' side by side (issue 48: three hosts'
probes one after another were a third of a second of every cached run)."""

from __future__ import annotations

import threading

import pytest

from alignflow.runner.engine import StepRunner
from alignflow.runner.session import open_run
from alignflow.transport import HostSnapshot, Transport
from tests.runner.conftest import FakeLab


def test_the_snapshots_of_several_hosts_are_taken_side_by_side_and_recorded_once(
        lab: FakeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = open_run(lab.store, lab.start())
    runner = StepRunner(ctx, store=lab.store, state_dir=lab.state, transport_factory=lab.transport,
                        controller=lab.controller)
    hosts = [runner.host(step) for step in ("npu_base_train", "convert_bf16", "gpu_train")]
    names = sorted({h.name for h in hosts})
    assert len(names) == 3
    together = threading.Barrier(len(names), timeout=10)  # taken one after another, the first would wait in vain
    real = Transport.snapshot

    def snapshot(self: Transport) -> HostSnapshot:
        together.wait()
        return real(self)

    monkeypatch.setattr(Transport, "snapshot", snapshot)
    taken = runner.snapshots(hosts)
    assert sorted(taken) == names
    assert {name: data["hostname"] for name, data in taken.items()} == {name: f"fake-{name}" for name in names}
    assert runner.snapshot(hosts[0]) == taken[hosts[0].name]  # recorded: not taken again (nothing would meet it)
    assert sorted(s.host for s in lab.store.snapshots(ctx.run_id)) == names


def test_a_fully_cached_run_finds_every_step_reusable_and_records_each_job_hosts_snapshot_once(lab: FakeLab) -> None:
    from alignflow.runner.cached import reusable_steps
    from alignflow.runner.run import data_artifact

    first = lab.run()
    assert first.status == "completed"
    ctx = open_run(lab.store, lab.start())
    runner = StepRunner(ctx, store=lab.store, state_dir=lab.state, transport_factory=lab.transport,
                        controller=lab.controller)
    try:
        steps = reusable_steps(runner, ctx.plan, {"data": data_artifact(ctx, state_dir=lab.state)})
    finally:
        runner.close()
    assert set(steps) == set(ctx.plan.steps)
    job_hosts = {runner.host(s).name for s in ctx.plan.steps if ctx.pipeline.step(s).executor == "job"}
    assert sorted(s.host for s in lab.store.snapshots(ctx.run_id)) == sorted(job_hosts)
