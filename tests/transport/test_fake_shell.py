"""The Shell seam: a new kind of host is one `Shell`, and every part of the transport runs over any Shell - shown
with `alignflow.testing.FakeShell`, in this process (the real shells: test_behaviour.py, test_slurm.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alignflow.config.hosts import Host
from alignflow.errors import PathNotAllowed, RemoteCommandError
from alignflow.testing import Command, FakeShell
from alignflow.transport import JobHandle, JobSpec, JobState, Result, Shell, Transport
from alignflow.transport.commands import script, script_name, with_prologue
from alignflow.transport.shell import Spawned
from alignflow.transport.slurm import SlurmJobs
from alignflow.transport.slurm_watch import Watcher
from tests.runner.hosts import DirHost, FakeJob, VirtualClock, controller_in_process

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


class PodShell(Shell):
    """A new kind of host: a Kubernetes pod, its commands through `kubectl exec` where kubectl runs."""

    def __init__(self, host: Host, kubectl: Shell) -> None:
        super().__init__(host)
        self.kubectl = kubectl

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return ["kubectl", "exec", "-i", f"pod/{self.host.name}", "--", *argv]

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
        return self.kubectl.exec(self._argv(argv), input=input, timeout_s=timeout_s)

    def spawn(self, argv: Sequence[str]) -> Spawned:  # `kubectl exec -i` holds the process open, stdin and all
        return self.kubectl.spawn(self._argv(argv))


def test_a_new_kind_of_host_is_one_shell_and_files_jobs_and_copies_work_over_it(tmp_path: Path) -> None:
    pod = Host(name="trainer-0", role="cuda", workdir=str(tmp_path / "pod"))
    inside = DirHost(pod, script=lambda spec: FakeJob(stdout="step 1\n", outputs={"ckpt/w.bin": b"w"}))
    sent: set[tuple[str, ...]] = set()

    def kubectl(command: Command) -> Result:  # the cluster: `kubectl exec -i POD -- ARGV` runs ARGV in the pod
        sent.add(command.argv[:5])
        return inside(replace(command, argv=command.argv[5:]))

    t = Transport(PodShell(pod, FakeShell(kubectl)), controller=controller_in_process, clock=VirtualClock())
    assert t.workdir().real == str(tmp_path / "pod")  # asked of the pod, as of any host
    t.write_text("cfg/a.yaml", "lr: 1e-3\n")
    assert t.read_text("cfg/a.yaml") == "lr: 1e-3\n"
    handle = t.launch(JobSpec(["python", "train.py"], name="train", cwd=t.path("out")))
    assert t.wait(handle).ok
    assert t.tail(handle) == "step 1\n"
    on_pod = t.sha256(["out/ckpt"])["out/ckpt"]
    fetched = t.get("out/ckpt", str(tmp_path / "fetched"))  # a tar stream through the pod's shell, verified
    assert fetched.sha256 == on_pod.sha256
    assert (tmp_path / "fetched" / "w.bin").read_bytes() == b"w"
    assert sent == {("kubectl", "exec", "-i", "pod/trainer-0", "--")}


def test_the_real_parts_read_what_the_fake_answers_and_refuse_before_sending() -> None:
    asked: list[Command] = []

    def host(command: Command) -> Result:
        asked.append(command)
        if command.name == "stat":
            return Result(0, b"regular file|5|1700000000.250000000|644\n")
        return Result(2, b"", b"tar: ckpt: Cannot open: No such file or directory\n")

    t = Transport(FakeShell(host))
    stat = t.stat("x")
    assert stat is not None
    assert (stat.path, stat.kind, stat.size_bytes, stat.mtime_ns) == ("/fake/x", "file", 5, 1_700_000_000_250_000_000)
    with pytest.raises(RemoteCommandError, match="exited 2") as info:
        t.run(["tar", "-cf", "-", "ckpt"])
    assert "Cannot open" in str(info.value)
    assert asked[-1].args == ("tar", "-cf", "-", "ckpt")  # an argv, the host's prologue around it
    with pytest.raises(PathNotAllowed):
        t.read_text("../elsewhere")
    assert len(asked) == 2  # the escape was refused on the controller: nothing reached the host


class ExecOnly(Shell):
    """A kind of host written to the old one-method contract: it runs commands, it cannot hold one open."""

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
        return Result(0, b"locked\n")


def test_a_shell_must_hold_a_spawned_command_open_rather_than_inherit_one_that_cannot() -> None:
    # The stand-in `spawn` it used to inherit ran the lock's holder on `exec`: the holder read end-of-file, printed
    # "locked" and exited, so `host_lock` released the copy's lock before the locked block ran (issue 46).
    with pytest.raises(TypeError, match="spawn"):
        ExecOnly(Host(name="old", role="cpu", workdir="/w"))  # type: ignore[abstract]


def test_a_spawned_command_runs_at_once_and_reads_its_stdin_as_it_is_sent() -> None:
    def host(command: Command) -> Result:
        command.write(b"ready\n")
        line = command.read_line()
        return Result(0, b"got " + line, b"", 0.0)

    spawned = FakeShell(host).spawn(["bash", "-c", "read x; echo got $x"])
    assert spawned.read_line() == b"ready\n"  # printed before its stdin said anything
    spawned.send(b"go\n")
    assert spawned.finish(timeout_s=5) == Result(0, b"got go\n")


def test_the_slurm_login_shell_runs_the_hosts_setup_lines_before_slurms_tools_in_one_bash() -> None:
    host = Host(name="cluster", role="cuda", workdir="/w", scheduler="slurm", slurm={"partition": "debug"},
                setup=["module load slurm"], env={"SLURM_CONF": "/etc/slurm/x.conf"})
    scontrol = (DATA / "scontrol_running.txt").read_text()
    asked: list[Command] = []

    def login(command: Command) -> Result:
        asked.append(command)
        disabled = "@@ SACCT 1\nSlurm accounting storage is disabled\n"
        return Result(0, f"{disabled}@@ JOB 42\n@@ SCONTROL 0\n{scontrol}\n".encode())

    t = Transport(FakeShell(login, host), jobs=lambda files: SlurmJobs(files, watcher=Watcher()))
    handle = JobHandle(host="cluster", job_id="j1", job_dir="/w/jobs/j1", pid=0, pgid=0, started_at=datetime.now(UTC),
                       name="train", argv=("x",), scheduler_id="42")
    assert t.status(handle) == JobState("running")
    (status,) = asked
    assert status.name == "slurm-status"
    assert status.args == ("42", "42", "/w/jobs/j1")  # values stay positional arguments
    lines = status.argv[2].splitlines()
    at = {what: next(i for i, line in enumerate(lines) if what in line)
          for what in ("# alignflow:slurm-status", "export SLURM_CONF=", "module load slurm", "scontrol show job")}
    assert list(at.values()) == sorted(at.values())  # the name, the host's env, its setup, then Slurm's tools
    assert at["# alignflow:slurm-status"] == 0


def test_every_script_is_named_on_its_first_line_and_any_other_argv_is_wrapped() -> None:
    argv = script("stat", 'stat -- "$1"', "/w/a b")
    assert script_name(argv) == "stat"
    assert argv[3:] == ["alignflow", "/w/a b"]
    assert script_name(["bash", "-c", "echo hi"]) is None
    assert with_prologue(argv, "") == argv
    spliced = with_prologue(argv, "export A=1")
    assert spliced[2] == '# alignflow:stat\nexport A=1\nstat -- "$1"'
    wrapped = with_prologue(["sbatch", "job.sbatch"], "export A=1")
    assert script_name(wrapped) == "run"
    assert wrapped[4:] == ["sbatch", "job.sbatch"]
