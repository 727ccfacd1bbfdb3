"""`make test`'s xdist scheduling: `--dist loadgroup`, with one worker as the lane of the groups that mostly wait.

On the 2-core machine two workers left the cores 11% idle over a whole `make test` (vmstat, 5 s samples): the groups
that wait on sshd, Slurm, a team's servers or a Prefect server's start-up ran beside a training group and the
second core had nothing to do. `TEST_WORKERS` is one worker more than the cores (Makefile); the last worker takes
`WAITING_GROUPS` while any is left, the other workers take the rest, and a worker out of its kind of group takes the
other kind, so that none idles at the end. Measured on the idle 2-core machine: the cores 97% busy instead of 89%.
With fewer than three workers the order is loadgroup's own (tests/conftest.py orders the groups longest first).
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadGroupScheduling

# The xdist groups (a lab's group or a module's path) whose tests mostly wait rather than compute.
WAITING_GROUPS = frozenset({"ssh-labs", "slurm-lab", "tests/deploy/test_team.py", "tests/flows/test_server.py"})


class LaneScheduling(LoadGroupScheduling):  # type: ignore[misc]
    """loadgroup, except that with three workers or more the last one (by gateway id) is the waiting groups' lane."""

    def __init__(self, config: Any, log: Any = None, waiting: frozenset[str] = WAITING_GROUPS) -> None:
        super().__init__(config, log)
        self.waiting = waiting

    def _assign_work_unit(self, node: Any) -> None:
        nodes = sorted(self.nodes, key=lambda n: n.gateway.id)
        if len(nodes) >= 3:
            waits = node is nodes[-1]
            first = next(iter(self.workqueue))
            scope = next((s for s in self.workqueue if (s in self.waiting) == waits), first)
            self.workqueue.move_to_end(scope, last=False)  # the parent hands out the queue's first group
        super()._assign_work_unit(node)
