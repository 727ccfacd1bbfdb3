"""MindSpore on a CPU host: run each PyNative task on the thread that issues it.

MindSpore queues PyNative work to background threads (`runtime/pipeline/async_rqueue.cc` in its source) and, when
it needs a result, waits for the queue to drain in a busy loop (`AsyncRQueue::Wait`: `while (!tasks_queue_->IsEmpty())
{}`). On an accelerator that overlaps host and device work; on a CPU host there is no device to overlap with, and
the waiting thread burns a core that the queue's own worker needs. `MS_DEV_HOST_BLOCKING_RUN=1`, read by
`AsyncRQueue::Push` at its first call, makes each task run where it is pushed.

Measured with the twin (4 layers, MoE, 2-core machine; logs and checkpoints byte for byte the same either way;
CPU-s over repeated runs, which vary by 10-20% on this machine):

| run | default | inline |
|---|---|---|
| 4 steps, idle | 10.6-10.8 CPU-s | 8.6-9.4 CPU-s |
| 8 steps, idle | 11.8-14.4 CPU-s | 12.2-12.7 CPU-s |
| 30 steps, idle | 17.2-28.7 CPU-s | 11.8-14.9 CPU-s |
| 8 steps, beside two busy processes | 20.1-22.2 CPU-s, 38-48 s | 10.0-12.0 CPU-s, 19-38 s |

The default costs most in longer runs and whenever the cores are shared (perf put 89% of a busy run's samples in
`AsyncRQueue::Wait`); the step from about ten steps on matches the actor runtime's switch between single- and
multi-threaded execution after its first 30 graph executions (`ActorDispatcher::kMultiThreadExecutionCountBegin`),
which is where we think it comes from.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

HOST_BLOCKING_RUN = "MS_DEV_HOST_BLOCKING_RUN"


def run_host_tasks_inline(environ: MutableMapping[str, str] | None = None) -> None:
    """Set `MS_DEV_HOST_BLOCKING_RUN=1` unless the environment sets it already (a value set outside is kept).
    Call before the first MindSpore operation of the process."""
    (os.environ if environ is None else environ).setdefault(HOST_BLOCKING_RUN, "1")
