"""Transports: run commands, detached jobs and verified copies on the hosts of `hosts.yaml`.

```python
from alignflow.transport import open_transport, copy_between, JobSpec

with open_transport(inventory.get("ascend")) as npu, open_transport(inventory.get("cpu")) as cpu:
    npu.run(["nvidia-smi"], check=False)                      # argv, never a shell string
    job = npu.launch(JobSpec(["python", "train.py"], name="npu_base_train"))
    store.save_handle(job.to_dict())                          # before polling: re-attach after a restart
    state = npu.wait(job, poll_s=10, timeout_s=6 * 3600)      # survives connection drops
    fp = copy_between(npu, "ckpt/base", cpu, "in/base")       # sha256 on npu, verified on cpu
```

Guarantees (issue 3): paths are confined to the host's workdir (lexically and, on the host, through
symlinks); host keys are checked with a reject policy against the host's managed known_hosts; every argument
reaches the host literally; a copy appears at its final path only after the destination host verified its
sha256; a host that does not answer raises `HostUnreachable` within its `connect_timeout_s`.
"""

from __future__ import annotations

from alignflow.config.hosts import Host
from alignflow.transport.jobs import JobHandle, JobSpec, JobState
from alignflow.transport.local import LocalTransport, controller_transport
from alignflow.transport.protocol import Completed, PathStat, PollFn, ProgressFn, Transport
from alignflow.transport.shell import ShellTransport
from alignflow.transport.snapshot import HostSnapshot
from alignflow.transport.ssh import SSHTransport
from alignflow.transport.transfer import copy_between

__all__ = [
    "Completed",
    "HostSnapshot",
    "JobHandle",
    "JobSpec",
    "JobState",
    "LocalTransport",
    "PathStat",
    "PollFn",
    "ProgressFn",
    "SSHTransport",
    "ShellTransport",
    "Transport",
    "controller_transport",
    "copy_between",
    "open_transport",
]

_TRANSPORTS: dict[str, type[ShellTransport]] = {"local": LocalTransport, "ssh": SSHTransport}


def open_transport(host: Host) -> ShellTransport:
    """The transport for `host` (nothing is connected until the first command)."""
    return _TRANSPORTS[host.transport](host)
