"""The lane of `make test`'s scheduler (tests/scheduling.py), driven through xdist's own scheduler protocol.

The workers are stand-ins for xdist's `WorkerController` (a gateway id, what they were sent): the scheduler under
test is xdist's real `LoadGroupScheduling` with the lane's one override.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from tests.scheduling import LaneScheduling

# Groups in the order tests/conftest.py gives them (longest first), three tests each; "wait-*" are the waiting ones.
COLLECTION = [f"{group}.py::test_{i}@{group}" for group in
              ("wait-a", "cpu-a", "wait-b", "cpu-b", "cpu-c", "wait-c", "cpu-d", "cpu-e", "cpu-f", "cpu-g", "cpu-h")
              for i in range(3)]
WAITING = frozenset({"wait-a", "wait-b", "wait-c"})


@dataclass(eq=False)
class Worker:
    name: str
    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> Any:
        return SimpleNamespace(id=self.name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def groups_of(worker: Worker, collection: list[str] = COLLECTION) -> list[str]:
    return list(dict.fromkeys(collection[i].split("@")[1] for i in worker.sent))


def run(workers: int, collection: list[str] = COLLECTION) -> list[Worker]:
    """Schedule `collection` on `workers` workers; each completes its tests in the order sent, in turn."""
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=False))
    scheduler = LaneScheduling(config, waiting=WAITING)  # type: ignore[arg-type]
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    done = dict.fromkeys(nodes, 0)
    while not scheduler.tests_finished:
        progressed = False
        for node in nodes:
            if done[node] < len(node.sent):
                scheduler.mark_test_complete(node, node.sent[done[node]])
                done[node] += 1
                progressed = True
        assert progressed, "tests left that no worker was sent"
    return nodes


def test_with_three_workers_the_last_one_takes_the_waiting_groups_and_the_others_the_rest() -> None:
    gw0, gw1, gw2 = run(3)
    assert groups_of(gw2)[:3] == ["wait-a", "wait-b", "wait-c"]
    assert not [g for g in groups_of(gw0) + groups_of(gw1) if g.startswith("wait")]
    assert groups_of(gw0)[0] == "cpu-a"  # each kind in the given order
    assert groups_of(gw1)[0] == "cpu-b"
    assert sorted(i for w in (gw0, gw1, gw2) for i in w.sent) == list(range(len(COLLECTION)))  # each test once


def test_a_worker_out_of_its_kind_of_group_takes_the_other_kind() -> None:
    one_waiting = [n for n in COLLECTION if n.startswith(("wait-a", "cpu"))]
    lane = run(3, one_waiting)[-1]
    assert groups_of(lane, one_waiting)[0] == "wait-a"
    assert groups_of(lane, one_waiting)[1:], "the lane idled once the waiting groups were gone"
    assert all(g.startswith("cpu") for g in groups_of(lane, one_waiting)[1:])


@pytest.mark.parametrize("workers", [1, 2])
def test_with_fewer_than_three_workers_the_groups_go_out_in_their_order(workers: int) -> None:
    nodes = run(workers)
    firsts = [groups_of(node)[0] for node in nodes]
    assert firsts == ["wait-a", "cpu-a"][:workers]
