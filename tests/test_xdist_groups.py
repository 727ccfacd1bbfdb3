"""`make test` runs each module on one worker (`--dist loadgroup`, groups set in tests/conftest.py).

A module's tests share module-scoped fixtures (a team topology, trained runs) that cost a minute or more each; a
module spread over two workers builds them twice. The groups only take effect if xdist sees them: it reads the
`xdist_group` markers in its own collection hook and appends `@group` to every node id.
"""

from __future__ import annotations

import pytest


def test_under_make_test_this_module_is_one_xdist_group(request: pytest.FixtureRequest) -> None:
    if not hasattr(request.config, "workerinput") or not request.config.getvalue("loadgroup"):
        pytest.skip("only under `make test` (pytest -n N --dist loadgroup)")
    assert request.node.nodeid.endswith("@tests/test_xdist_groups.py"), request.node.nodeid


def test_a_last_in_group_test_ends_its_group_which_its_module_starts(request: pytest.FixtureRequest) -> None:
    """The Slurm time-limit test waits on a job its module's fixture launched: the rest of the Slurm group has to run
    between the two, or the test idles its worker for a minute."""
    items = request.session.items
    last = [item for item in items if item.get_closest_marker("last_in_group")]
    if not last:
        pytest.skip("no `last_in_group` test collected (the Slurm tests are integration tests)")

    def group(item: pytest.Item) -> str:
        marker = item.get_closest_marker("xdist_group")
        assert marker is not None, item.nodeid
        return str(marker.args[0])

    for item in last:
        members = [other for other in items if group(other) == group(item)]
        assert members[-1] is item, [m.nodeid for m in members[-3:]]
        assert members[0].path == item.path, members[0].nodeid
        assert len({m.path for m in members}) > 1, "the group is one module: nothing runs while the test waits"
