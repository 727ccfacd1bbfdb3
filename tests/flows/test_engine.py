"""The step engine's guarantees that need no training: re-attachment after a lost connection, host job slots
(the slots themselves are tested in tests/transport/test_behaviour.py, across two controllers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from alignflow import pipeline
from alignflow.config.hosts import Host
from alignflow.errors import HostUnreachable
from alignflow.logs.render import mindformers_pynative_line
from alignflow.runner.engine import StepRunner
from alignflow.runner.jobstep import run_job_step
from alignflow.runner.run import data_artifact, start_run
from alignflow.runner.session import open_run
from alignflow.store import Store
from alignflow.transport import LocalShell, Transport
from tests.flows.conftest import make_flow_env


class DropsFirstWait(Transport):
    """A real local host's transport whose first `wait` ends like a poller that lost its host for good.

    A fake only for the fault: `wait` itself reconnects through ordinary drops (tested for real with sshd in
    tests/transport); giving up entirely needs a host down for longer than the poll deadline.
    """

    dropped = 0

    def __init__(self, host: Host) -> None:
        super().__init__(LocalShell(host))

    def wait(self, handle: Any, **kw: Any) -> Any:
        if DropsFirstWait.dropped == 0:
            DropsFirstWait.dropped += 1
            raise HostUnreachable("connection lost while polling", host=self.host.name)
        return super().wait(handle, **kw)


@pytest.mark.integration
def test_a_retried_step_reattaches_to_its_running_job_instead_of_launching_again(
    tmp_path: Path, repo_root: Path
) -> None:
    env = make_flow_env(tmp_path, repo_root)
    log = tmp_path / "base.log"
    log.write_text("".join(mindformers_pynative_line(s, 4, loss=5.0, step_time_ms=1, lr=1e-3, grad_norm=1.0,
                                                     consumed_samples=4 * s, global_batch_size=4) + "\n"
                           for s in range(1, 5)))
    exp = yaml.safe_load(env.experiment.read_text())
    exp["steps"] = {"npu_base_train": {"command": [
        "bash", "-c", 'sleep 2; mkdir -p "$1/checkpoint" && echo 1 > "$1/checkpoint/latest_checkpointed_iteration.txt"'
        ' && cat "$2"', "x", "{out}", str(log)]}}
    env.experiment.write_text(yaml.safe_dump(exp, sort_keys=False))
    with Store.open(state_dir=env.state) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        ctx = open_run(store, run_id)
        runner = StepRunner(ctx, store=store, state_dir=env.state, transport_factory=DropsFirstWait)
        spec = pipeline.DEFAULT.step("npu_base_train")
        try:
            data = data_artifact(ctx, state_dir=env.state)
            with pytest.raises(HostUnreachable):
                run_job_step(runner, spec, {"data": data})
            outcome = run_job_step(runner, spec, {"data": data})  # what run_step's retry does (runner.retry)
        finally:
            runner.close()
        assert outcome.status == "ran"
        steps = [s for s in store.steps(run_id) if s.step == "npu_base_train"]
        assert len(steps) == 1  # one step run, one job
        jobs = list((env.state / "hosts" / "ascend" / "jobs").iterdir())  # relative workdirs: under the state dir
        assert len(jobs) == 1
        # the step's job held one of the host's job slots (on the host, shared by every controller)
        assert (jobs[0] / "slot").read_text().startswith("holding job slot 0 of 1 since ")
