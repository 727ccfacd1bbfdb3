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
