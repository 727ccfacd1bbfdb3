"""No orphan runs: a run whose controller died shows `interrupted` with the job it left, `cancel` kills that job.

The runs are recorded by `start_run` (the tiny experiment, three local hosts) with a controller identity given to
the store: a process that is dead, or a live `sleep` standing in for a controller. Their step's job is a real
detached job on a local host; the commands are the real command line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from alignflow import controller
from alignflow.config.hosts import Host
from alignflow.runner.run import start_run
from alignflow.runner.session import open_run
from alignflow.store import RunStatus, StepStatus, Store
from alignflow.transport import JobHandle, JobSpec, JobState, open_transport
from tests.flows.conftest import FlowEnv, make_flow_env

pytestmark = pytest.mark.integration  # real processes: the command line, hosts' commands


@dataclass
class Recorded:
    env: FlowEnv
    run_id: str
    handle: JobHandle
    cli_env: dict[str, str]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "alignflow", *args], cwd=self.env.root, env=self.cli_env,
                              capture_output=True, text=True, timeout=300, check=False)

    def run(self) -> object:
        with Store.open(state_dir=self.env.state) as store:
            return store.get_run(self.run_id)

    def job_state(self) -> JobState:
        with open_transport(_ascend(self.env, self.run_id)) as t:
            return t.status(self.handle)


def _dead_identity() -> controller.ControllerIdentity:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return controller.ControllerIdentity(host=socket.gethostname(), pid=proc.pid, boot_id=controller.boot_id(),
                                         start_ticks=1)


def _record(tmp_path: Path, repo_root: Path, subprocess_env: dict[str, str], ident: controller.ControllerIdentity
            ) -> Recorded:
    env = make_flow_env(tmp_path / "exp", repo_root)
    with Store.open(state_dir=env.state, controller=ident.to_dict) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        step = store.start_step(run_id, "npu_base_train", host="ascend", command="train", cache_key="k", inputs={})
        with open_transport(_ascend(env, run_id, store)) as t:
            handle = t.launch(JobSpec(["sleep", "300"], name="npu_base_train"))
        store.attach_job(step.id, job_dir=handle.job_dir, handle=handle.model_dump(mode="json"))
    cli_env = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(env.state)}
    return Recorded(env, run_id, handle, cli_env)


def _ascend(env: FlowEnv, run_id: str, store: Store | None = None) -> Host:
    """The run's ascend host, as recorded (its workdir under the run's state dir)."""
    if store is None:
        with Store.open(state_dir=env.state) as opened:
            return _ascend(env, run_id, opened)
    return open_run(store, run_id).inventory.get("ascend")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_run_whose_controller_died_is_shown_interrupted_with_its_job_and_cancel_kills_it(
        tmp_path: Path, repo_root: Path, subprocess_env: dict[str, str]) -> None:
    rec = _record(tmp_path, repo_root, subprocess_env, _dead_identity())
    assert rec.job_state().kind == "running"
    # the controller died while it fetched the GPU log into the run's directory (seen in the crash test): the
    # staging name of that copy; the log fetched before it stays
    logs = rec.env.state / "runs" / rec.run_id / "logs"
    staging = logs / ".af-partial-gpu_train.log-9398d073-1be895ac"
    staging.mkdir(parents=True)
    (staging / "payload").write_text("iteration 1/8 |")
    (logs / ".af-write.Xq81Zt").write_text("{")  # and a write it had begun
    (logs / "npu_base_train.log").write_text("kept")
    history = rec.cli("history")
    assert history.returncode == 0, history.stderr
    assert "interrupted" in history.stdout
    assert f"{rec.run_id}: npu_base_train on ascend ({rec.handle.job_dir})" in history.stdout
    assert f"run {rec.run_id} of tiny interrupted" in history.stderr  # said once, when it was noticed
    assert rec.run().status == RunStatus.INTERRUPTED  # type: ignore[attr-defined]
    assert rec.job_state().kind == "running"  # noticing kills nothing
    assert sorted(p.name for p in logs.iterdir()) == ["npu_base_train.log"]  # ... and removes the dead copy's staging
    assert "interrupted" not in rec.cli("history").stderr

    cancelled = rec.cli("cancel", rec.run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert rec.handle.job_dir in cancelled.stdout
    assert rec.job_state().kind == "cancelled"
    run = rec.run()
    assert run.status == RunStatus.CANCELLED  # type: ignore[attr-defined]
    assert "controller" in (run.error or "")  # type: ignore[attr-defined]
    again = rec.cli("cancel", rec.run_id)
    assert again.returncode == 2
    assert "nothing to cancel" in again.stderr


def test_cancel_of_a_live_run_stops_its_controller_then_its_jobs(
        tmp_path: Path, repo_root: Path, subprocess_env: dict[str, str], sleeper: subprocess.Popen[bytes]) -> None:
    rec = _record(tmp_path, repo_root, subprocess_env, controller.current(pid=sleeper.pid))
    assert "running" in rec.cli("history").stdout
    refused = rec.cli("rerun", rec.run_id)
    assert refused.returncode == 2
    assert "still running" in refused.stderr
    done = rec.cli("cancel", rec.run_id)
    assert done.returncode == 0, done.stderr
    assert sleeper.wait(timeout=30) == -15  # SIGTERM
    assert rec.job_state().kind == "cancelled"
    with Store.open(state_dir=rec.env.state) as store:
        assert store.get_run(rec.run_id).status == RunStatus.CANCELLED
        assert {s.step: s.status for s in store.steps(rec.run_id)} == {"npu_base_train": StepStatus.CANCELLED}


def test_history_reconcile_names_runs_it_cannot_judge(tmp_path: Path, repo_root: Path,
                                                      subprocess_env: dict[str, str]) -> None:
    ident = controller.ControllerIdentity(host="another-controller", pid=os.getpid())
    rec = _record(tmp_path, repo_root, subprocess_env, ident)
    try:
        done = rec.cli("history", "--reconcile")
        assert done.returncode == 0
        assert f"run {rec.run_id} is running: driven by pid {os.getpid()} on another-controller" in done.stderr
        assert rec.run().status == RunStatus.RUNNING  # type: ignore[attr-defined]
    finally:
        with open_transport(_ascend(rec.env, rec.run_id)) as t:
            t.cancel(rec.handle, grace_s=1)


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "in-a-class-body"])
def test_a_ctrl_c_as_the_command_starts_ends_it_interrupted_without_a_traceback(
        wrapped: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C before the command ran a line of its own (the state dir being resolved, its modules imported): exit
    130, `interrupted`. Python 3.11 wraps one that lands while a pydantic model class is created in `RuntimeError:
    Error calling __set_name__` (tests/faults/test_interrupted_writers.py, a Ctrl-C 0.04 s into a command)."""
    from alignflow.cli import main
    from alignflow.staging import completed_in_process

    def pressed() -> None:
        if not wrapped:
            raise KeyboardInterrupt
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__ on 'PydanticDescriptorProxy' instance") from exc

    # what main() calls first, replaced where main looks it up (another test of the worker may have imported the
    # CLI's modules afresh, and MPLCONFIGDIR may be set: the state dir is then not resolved at all)
    monkeypatch.setitem(main.__globals__, "_caches_in_state_dir", pressed)
    # nothing committed by this process yet (an earlier test's writes in this worker would make it "interrupted
    # after ... completed: the result is whole", exit 0)
    monkeypatch.setitem(completed_in_process.__globals__, "_completed", [])
    monkeypatch.setattr("sys.argv", ["alignflow", "history"])
    try:
        main()
    except SystemExit as ended:
        code = ended.code
    except KeyboardInterrupt:  # not raised on: it would end the test session
        code = "KeyboardInterrupt escaped main()"
    out = capsys.readouterr()
    assert code == 130
    assert "interrupted" in out.err
    assert "Traceback" not in out.err + out.out


@pytest.mark.parametrize("committed", [True, False], ids=["after-the-rename", "before-the-rename"])
def test_a_ctrl_c_inside_a_conversion_says_whether_its_result_is_whole(
        committed: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C inside a command reaches main(), not typer (which ends it with a silent exit 130): after the
    conversion's rename (while it prints its summary) the result is whole, exit 0 and said so; before it, 130."""
    import torch

    import alignflow.cli.convert as convert_cli
    from alignflow.cli import main
    from alignflow.staging import completed_in_process
    from tests.convert.synthetic import source_state, write_mindformers

    base = write_mindformers(tmp_path / "base", source_state("twin-dense", dtype=torch.float32))
    dst = tmp_path / "bf16"

    def pressed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setitem(completed_in_process.__globals__, "_completed", [])
    if committed:  # the summary, printed once the destination is renamed into place and recorded
        monkeypatch.setitem(convert_cli._run.__globals__, "_report", pressed)
    else:  # the conversion itself, before anything is renamed into place
        monkeypatch.setitem(convert_cli._run.__globals__, "_progress", pressed)
    monkeypatch.setattr("sys.argv", ["alignflow", "convert", "bf16", str(base), str(dst)])
    try:
        main()
    except SystemExit as ended:
        code = ended.code
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped main()"
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    if committed:
        assert (code, dst.is_dir()) == (0, True)
        assert f"interrupted after {dst} completed: the result is whole" in out.err
    else:
        assert (code, dst.exists()) == (130, False)
        assert "interrupted" in out.err
