"""Transports: run commands, detached jobs and verified copies on the hosts of `hosts.yaml`.

```python
from alignflow.transport import open_transport, copy_between, JobSpec

with open_transport(inventory.get("ascend")) as npu, open_transport(inventory.get("cpu")) as cpu:
    npu.run(["nvidia-smi"], check=False)                      # argv, never a shell string
    job = npu.launch(JobSpec(["python", "train.py"], name="npu_base_train"))
    store.save_handle(job.model_dump(mode="json"))            # before polling: re-attach after a restart
    state = npu.wait(job, poll_s=10, timeout_s=6 * 3600)      # survives connection drops
    fp = copy_between(npu, "ckpt/base", cpu, "in/base")       # sha256 on npu, verified on cpu
```

Guarantees (issue 3): paths are confined to the host's workdir (lexically and, on the host, through
symlinks); host keys are checked with a reject policy against the host's managed known_hosts; every argument
reaches the host literally; a copy appears at its final path only after the destination host verified its
sha256; a host that does not answer raises `HostUnreachable` within its `connect_timeout_s`.

Under the facade, one seam: a `Shell` (`exec`, `spawn`, its workdir) per kind of host - see shell.py for the
parts built on it, and docs/architecture.md#adding-a-transport for a new kind of host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alignflow.transport.facade import Transport, controller_transport, copy_between, open_transport
from alignflow.transport.jobs import JobHandle, JobSpec, JobState
from alignflow.transport.local import LocalShell
from alignflow.transport.results import Completed, PathStat, ProgressFn
from alignflow.transport.scheduler import PollFn
from alignflow.transport.shell import Result, Shell
from alignflow.transport.snapshot import HostSnapshot

if TYPE_CHECKING:
    from alignflow.transport.ssh import SSHShell


def __getattr__(name: str) -> object:
    """`SSHShell` on first use: it imports Paramiko (with cryptography), which a run on local hosts never needs."""
    if name == "SSHShell":
        from alignflow.transport.ssh import SSHShell

        return SSHShell
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Completed",
    "HostSnapshot",
    "JobHandle",
    "JobSpec",
    "JobState",
    "LocalShell",
    "PathStat",
    "PollFn",
    "ProgressFn",
    "Result",
    "SSHShell",
    "Shell",
    "Transport",
    "controller_transport",
    "copy_between",
    "open_transport",
]
