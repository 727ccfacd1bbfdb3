"""Slurm hosts on a real Slurm (the lab's cluster, tests/lab/slurm.py): what a job goes through.

Every test submits real sbatch jobs through the transport (a `LocalShell`) of a `scheduler: slurm` host and reads their
state back from scontrol, as a step of a run does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from alignflow.errors import RemoteJobError
from alignflow.transport import JobHandle, JobSpec, JobState, Transport, open_transport
from alignflow.transport.slurm_check import check_slurm_host
from tests.lab.slurm import CLOCK_PARTITION, SlurmLab

pytestmark = pytest.mark.integration


def _transport(lab: SlurmLab, tmp_path: Path, **slurm: object) -> Transport:
    return open_transport(lab.host("cuda", workdir=tmp_path / "work", **slurm))


def _until(t: Transport, handle: JobHandle, kinds: set[str], timeout_s: float = 60) -> JobState:
    deadline = time.monotonic() + timeout_s
    state = t.status(handle)
    while state.kind not in kinds:
        assert time.monotonic() < deadline, f"job {handle.scheduler_id} still {state} after {timeout_s} s"
        time.sleep(0.3)
        state = t.status(handle)
    return state


def _lab_processes(lab: SlurmLab, argv: str) -> list[int]:
    """Processes of the lab (its daemons and jobs) whose command line is exactly `argv`."""
    found = []
    for pid in lab.ns.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if [a.decode() for a in cmdline] == argv.split():
            found.append(pid)
    return found


def test_a_job_is_pending_with_slurms_reason_then_runs_and_completes(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    t = _transport(slurm_lab, tmp_path)
    slurm_lab.hold_node()
    try:
        handle = t.launch(JobSpec(["bash", "-c", "echo started; sleep 2; echo done"], name="lifecycle"))
        assert handle.scheduler_id is not None
        assert handle.scheduler_id.isdigit()
        assert (Path(handle.job_dir) / "slurm_job_id").read_text().strip() == handle.scheduler_id
        pending = _until(t, handle, {"pending"})
        deadline = time.monotonic() + 30
        while "DRAINED" not in pending.note and time.monotonic() < deadline:  # until the scheduler has looked at it
            time.sleep(0.3)
            pending = t.status(handle)
        assert pending.kind == "pending"
        assert not pending.finished
        assert pending.note.startswith("Slurm PENDING in partition debug: ")
        assert "DRAINED" in pending.note
    finally:
        slurm_lab.release_node()
    seen: list[str] = []
    final = t.wait(handle, poll_s=0.3, timeout_s=120, on_poll=lambda s: seen.append(s.kind))
    assert final.ok, final
    assert seen[0] == "pending"
    assert "running" in seen
    assert seen[-1] == "exited"
    assert t.tail(handle) == "started\ndone\n"
    script = (Path(handle.job_dir) / "job.sbatch").read_text()
    assert "#SBATCH --partition=debug\n" in script
    assert "#SBATCH --output=stdout\n" in script


def test_a_failing_job_exits_with_its_code_and_its_stderr_is_collected(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    t = _transport(slurm_lab, tmp_path)
    handle = t.launch(JobSpec(["bash", "-c", "echo 'Traceback: it broke' >&2; exit 3"], name="fails"))
    state = t.wait(handle, poll_s=0.3, timeout_s=120)
    assert (state.kind, state.exit_code, state.ok) == ("exited", 3, False)
    assert "Traceback: it broke" in t.tail(handle, stream="stderr")
    assert (Path(handle.job_dir) / "exit_code").read_text().strip() == "3"
    with pytest.raises(RemoteJobError, match=r"exited\(3\)"):
        t.wait(handle, check=True)


def test_cancel_is_scancel_and_ends_every_process_of_the_job(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    t = _transport(slurm_lab, tmp_path)
    handle = t.launch(JobSpec(["bash", "-c", "sleep 301 & sleep 301; wait"], name="cancelled"))
    _until(t, handle, {"running"})
    deadline = time.monotonic() + 30
    while len(_lab_processes(slurm_lab, "sleep 301")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_lab_processes(slurm_lab, "sleep 301")) == 2
    state = t.cancel(handle)
    assert state.kind == "cancelled"
    assert state.note.startswith("Slurm CANCELLED")
    assert slurm_lab.client(["scontrol", "show", "job", "-o", str(handle.scheduler_id)]).stdout.count(
        "JobState=CANCELLED") == 1
    deadline = time.monotonic() + 30
    while _lab_processes(slurm_lab, "sleep 301") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _lab_processes(slurm_lab, "sleep 301") == []


def test_an_unknown_partition_fails_at_once_with_slurms_message(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    t = _transport(slurm_lab, tmp_path, partition="nosuch")
    start = time.monotonic()
    with pytest.raises(RemoteJobError, match=r"Slurm refused job .*invalid partition specified: nosuch"):
        t.launch(JobSpec(["true"], name="bad"))
    assert time.monotonic() - start < 30
    assert slurm_lab.jobs() == [] or all("nosuch" not in j for j in slurm_lab.jobs())
    (job_dir,) = (tmp_path / "work" / "jobs").iterdir()
    assert "Invalid partition name specified" in (job_dir / "submit_error").read_text()
    with pytest.raises(RemoteJobError, match="never ran: submit refused"):
        t.attach(job_dir.name)


def test_an_sbatch_refusal_fails_at_once_with_slurms_message(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    t = _transport(slurm_lab, tmp_path, gpus_per_node=1)  # the lab's node has no GPUs
    with pytest.raises(RemoteJobError, match=r"sbatch\): sbatch: error: Invalid generic resource \(gres\)"):
        t.launch(JobSpec(["true"], name="gpu"))


def test_a_preempted_job_fails_as_preempted(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    t = _transport(slurm_lab, tmp_path, cpus_per_task=2)  # the whole node
    handle = t.launch(JobSpec(["sleep", "300"], name="low"))
    _until(t, handle, {"running"})
    urgent = slurm_lab.client(["sbatch", "--parsable", "-p", "urgent", "-c", "2", "-o", "/dev/null", "--wrap",
                               "true"]).stdout.strip()
    state = t.wait(handle, poll_s=0.3, timeout_s=120)
    assert (state.kind, state.note) == ("preempted", "Slurm PREEMPTED")
    assert not state.ok
    assert str(state) == "preempted (Slurm PREEMPTED)"
    slurm_lab.client(["scancel", urgent], check=False)


@pytest.fixture(scope="session", autouse=True)
def too_long_job(slurm_lab: SlurmLab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TooLong]:
    """A job past its one-minute time limit (Slurm's shortest), on the lab's clock node, launched when this module's
    first test starts and waited for by a thread as the controller would: the time-limit test runs last in the
    Slurm group (`last_in_group`), when Slurm has long ended the job, instead of idling 60-90 s for it."""
    t = _transport(slurm_lab, tmp_path_factory.mktemp("too-long"), partition=CLOCK_PARTITION, time_limit="1")
    handle = t.launch(JobSpec(["sleep", "600"], name="too-long", time_limit_s=3600))
    with ThreadPoolExecutor(1, thread_name_prefix="too-long") as pool:
        # the controller waits for Slurm past its own deadline
        yield TooLong(handle, pool.submit(t.wait, handle, poll_s=1.0, timeout_s=60))
        if not t.status(handle).finished:
            t.cancel(handle)


@dataclass(frozen=True)
class TooLong:
    handle: JobHandle
    state: Future[JobState]


@pytest.mark.slow
@pytest.mark.last_in_group
def test_a_job_past_its_time_limit_fails_as_timeout(too_long_job: TooLong) -> None:
    assert "#SBATCH --time=00:01:00\n" in (Path(too_long_job.handle.job_dir) / "job.sbatch").read_text()
    state = too_long_job.state.result(timeout=300)
    assert state.kind == "timeout"
    assert state.note.startswith("Slurm TIMEOUT: ran 00:01:")
    assert state.note.endswith("of its 00:01:00 time limit")


_CONTROLLER = """
import json, sys, time
from alignflow.config.hosts import Host
from alignflow.transport import JobSpec, open_transport
t = open_transport(Host.model_validate(json.loads(sys.argv[1])))
h = t.launch(JobSpec(["bash", "-c", "sleep 4; echo finished by slurm"], name="survivor"))
open(sys.argv[2], "w").write(json.dumps(h.model_dump(mode="json")))
t.wait(h, poll_s=0.5)
"""


def test_a_new_controller_reattaches_by_the_recorded_job_id(slurm_lab: SlurmLab, tmp_path: Path,
                                                            subprocess_env: dict[str, str]) -> None:
    host = slurm_lab.host("cuda", workdir=tmp_path / "work")
    record = tmp_path / "handle.json"
    controller = subprocess.Popen([sys.executable, "-c", _CONTROLLER, host.model_dump_json(), str(record)],
                                  env=subprocess_env)
    deadline = time.monotonic() + 60
    while not record.exists() and time.monotonic() < deadline:
        assert controller.poll() is None, "the first controller died before recording its job"
        time.sleep(0.1)
    os.kill(controller.pid, signal.SIGKILL)  # the controller crashes while polling
    controller.wait()
    handle = JobHandle.model_validate(json.loads(record.read_text()))
    with open_transport(host) as t:
        assert t.attach(handle.job_id) == handle  # what a controller without the store finds in the job dir
        state = t.wait(handle, poll_s=0.3, timeout_s=120)
        assert state.ok
        assert t.tail(handle) == "finished by slurm\n"


def test_a_slurm_host_without_sacct_is_a_preflight_error(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a login node whose PATH has Slurm's tools but sacct
    bin_dir.mkdir()
    for tool in ("sbatch", "scontrol", "scancel", "sinfo", "sed", "head", "cat"):
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    host = slurm_lab.host("cuda", workdir=tmp_path / "work").model_copy(
        update={"env": {**slurm_lab.env(), "PATH": str(bin_dir)}})
    check = check_slurm_host(open_transport(host).shell)
    assert check.errors == ["cuda: Slurm host without sacct (it tells how a job ended once the controller forgot "
                            "it); install Slurm's client tools there, or fix PATH with the host's env/setup"]
    full = check_slurm_host(_transport(slurm_lab, tmp_path).shell)
    assert full.errors == []
    assert full.partitions == ["debug", "urgent", "clock"]
    assert full.warnings
    assert "accounting is disabled" in full.warnings[0]
    wrong = check_slurm_host(_transport(slurm_lab, tmp_path, partition="gpu").shell)
    assert wrong.errors == ["cuda: slurm.partition 'gpu' does not exist; the cluster has: clock, debug, urgent"]
