"""`SlurmLoginShell`: the login node of a Slurm cluster, where sbatch, scontrol, sacct and scancel are run.

The login node is reached the way hosts.yaml says (a `LocalShell` or an `SSHShell`); this shell puts the host's
env and setup lines in front of every command, because the cluster's client tools often need them (a `module load
slurm`, a `SLURM_CONF`). Slurm's jobs (`slurm.SlurmJobs`) and the host check (`slurm_check`) run on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alignflow.transport.commands import render_prologue, with_prologue
from alignflow.transport.openssh import OpenSSHClient
from alignflow.transport.shell import Result, Shell, Spawned, Workdir


class SlurmLoginShell(Shell):
    """A Slurm cluster's login node over `shell` (which it does not own: closing is the owner's), every command
    run with the host's env and setup lines."""

    def __init__(self, shell: Shell) -> None:
        super().__init__(shell.host)
        self.shell = shell
        self.default_python = shell.default_python
        self.on_this_machine = shell.on_this_machine

    def _argv(self, argv: Sequence[str]) -> list[str]:
        # no cwd: the client tools run wherever the login shell starts; a job's own cwd is in its batch script
        return with_prologue(argv, render_prologue(host_env=self.host.env, setup=self.host.setup, env=None, cwd=None))

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
        return self.shell.exec(self._argv(argv), input=input, timeout_s=timeout_s)

    def spawn(self, argv: Sequence[str]) -> Spawned:
        return self.shell.spawn(self._argv(argv))

    def openssh_client(self) -> OpenSSHClient | None:
        return self.shell.openssh_client()

    def workdir(self) -> Workdir:
        return self.shell.workdir()
