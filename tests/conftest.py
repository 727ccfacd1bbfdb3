"""Shared pytest fixtures, and the rule of the unit tier.

Integration fixtures (real sshd lab hosts, a real PostgreSQL server, one Prefect harness per session) live in
`tests/lab/` modules and are imported here so that every test module can request them.

Tiers: `make test-unit` runs the tests marked neither `integration` nor `slow` with `ALIGNFLOW_TEST_TIER=unit`,
and in that tier starting a process fails the test — a test that needs a real process (sshd, PostgreSQL,
Prefect, a training, a CLI subprocess) says so with its marker, so the unit tier stays a minute long.
`make test` runs everything.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.lab.slurm import SlurmLab
    from tests.lab.sshd import SSHLab

REPO_ROOT = Path(__file__).resolve().parent.parent

# Lab fixtures with real processes: `postgres_server` (session), `postgres_url` (an empty database per test).
pytest_plugins = ["tests.lab.postgres", "tests.chromium"]  # the real Chromium: `browser`, `page`


UNIT_TIER = os.environ.get("ALIGNFLOW_TEST_TIER") == "unit"

# One OpenMP thread per process, for every process the tests start (it is inherited): torch's default of one per core
# makes each thread of a training or conversion spin while it waits for a core that another test holds. Beside two
# busy processes on the 2-core machine a tiny twin training took 4.9 CPU-s with two threads and 3.4 with one, its
# checkpoint byte for byte the same. A value set outside (OMP_NUM_THREADS=2 make test) is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# MindSpore in the test processes themselves (tests/twin/test_mindspore_side.py imports it, the msprobe dump scripts
# run it) runs each PyNative task inline, as the twin and the MindFormers lab do (alignflow.frameworks.mindspore_host):
# its default queue waits in a busy loop. With the lab, msprobe and MindSpore-side tests it took 71 CPU-s, 80 without.
os.environ.setdefault("MS_DEV_HOST_BLOCKING_RUN", "1")

_MODULE_TIER = re.compile(r"^pytestmark = .*\b(integration|slow)\b", re.M)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the unit tier, a test module marked `integration` or `slow` as a whole is not even imported (its
    imports — megatron-core, MindSpore, Prefect's harness — are what makes collection slow)."""
    if UNIT_TIER and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return bool(_MODULE_TIER.search(collection_path.read_text(encoding="utf-8"))) or None
    return None


# Fixtures whose users run as one xdist group, one module after the other on the same worker (make test:
# `pytest -n N --dist loadgroup`); the other modules spread over the workers.
# - The labs hold machine-wide resources: the SSH lab binds 127.0.0.11-13, the jump lab 127.0.0.14-15, the Slurm lab
#   its network namespace and its daemons' ports. `site` (tests/faults) and `make_transport` (tests/transport) take
#   the SSH lab for their `ssh` parameter through `request.getfixturevalue("ssh_lab")`, as does a test that asks for
#   it so itself: none of them names the lab, and left out of its group they started a second SSH lab on the other
#   worker while the first one ran (two CI rehearsals lost an SSH connection mid-command in such a module).
# - `ms_base` is a session fixture worth sharing: a MindSpore base training (11 s) that three twin modules read; on
#   one worker it is trained once, spread over two it was trained on each.
GROUP_OF_FIXTURE = {"ssh_lab": "ssh-labs", "lab_hosts_yaml": "ssh-labs", "jump_lab": "ssh-labs", "site": "ssh-labs",
                    "make_transport": "ssh-labs", "slurm_lab": "slurm-lab", "ms_base": "twin-ms-base"}
_ASKS_FOR_A_FIXTURE = re.compile(r"""getfixturevalue\(["'](\w+)["']\)""")

# Seconds each long group took under `make test` on the idle 2-core machine (2026-12-06, issue 40's cuts, three
# workers with the lane of tests/scheduling.py: junit times summed per group), for the order alone: within each kind
# of group the longest start first (longest-processing-time scheduling), so that no long group starts while the other
# workers run out of work. A module not listed counts 30 s if it has slow tests, else 5 s.
MEASURED_S = {
    "ssh-labs": 170, "tests/deploy/test_team.py": 129, "slurm-lab": 97, "tests/flows/test_server.py": 47,  # the lane's
    "tests/journeys/test_walk.py": 123, "tests/faults/test_crash.py": 94, "tests/flows/test_alignment.py": 93,
    "tests/deploy/test_ui_browser.py": 91, "twin-ms-base": 74, "tests/recipes/test_megatron_core.py": 69,
    "tests/flows/test_gate.py": 52, "tests/flows/test_interrupt.py": 49,
    "tests/convert/test_megatron_core_dist.py": 48, "tests/lab/test_mindformers_lab.py": 47,
    "tests/faults/test_interrupted_writers.py": 46, "tests/twin/test_model_parallel.py": 40,
    "tests/diagnose/test_seed_bugs.py": 35, "tests/diagnose/test_msprobe.py": 32, "tests/store/test_concurrency.py": 23,
    "tests/logs/test_fuzz.py": 21, "tests/faults/test_concurrent_runs.py": 120,  # issue 49's three tests
    "tests/faults/test_cancel.py": 140,  # 20 seeds (136-142 s on the session's machine, 2026-12-07)
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadgroup` with a lane for the groups that mostly wait (tests/scheduling.py)."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from tests.scheduling import LaneScheduling

    return LaneScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for `--dist loadgroup`: the modules using a fixture of `GROUP_OF_FIXTURE` in its group, every
    other module as a group of its own. A module's tests share module-scoped fixtures (a team topology, a trained
    run) and some build on each other in file order: spread over two workers, each worker built those fixtures again
    (the deploy tests' topology and their demo runs twice). Then order the groups longest first (`make test` passes
    `--no-loadscope-reorder`, or xdist would put the groups with the most tests first instead).

    xdist's worker turns the `xdist_group` markers into the node ids' `@group` suffix in its own
    `pytest_collection_modifyitems`: this one runs before it (`tryfirst`), and pytest must be below 9.2, whose node
    ids ignore that suffix (pyproject.toml; tests/test_xdist_groups.py)."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    asked: dict[Path, list[str]] = {}
    shared_group: dict[str, str] = {}
    for item in items:
        if item.path not in asked:
            asked[item.path] = _ASKS_FOR_A_FIXTURE.findall(item.path.read_text(encoding="utf-8")) \
                if item.path.suffix == ".py" else []
        for fixture in [*getattr(item, "fixturenames", ()), *asked[item.path]]:
            if fixture in GROUP_OF_FIXTURE:
                shared_group[module(item)] = GROUP_OF_FIXTURE[fixture]
    slow = {module(item) for item in items if item.get_closest_marker("slow")}

    def group(item: pytest.Item) -> str:
        return shared_group.get(module(item), module(item))

    def cost(name: str) -> float:
        return MEASURED_S.get(name, 30 if name in slow else 5)

    # A `last_in_group` test waits on something its module's fixture started (the Slurm time limit's job): its
    # module starts the group and the test ends it, so that the rest of the group runs while it waits.
    last = {item.nodeid for item in items if item.get_closest_marker("last_in_group")}
    starts = {module(item) for item in items if item.nodeid in last}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    items.sort(key=lambda item: (-cost(group(item)), item.nodeid in last, module(item) not in starts))  # stable


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if not UNIT_TIER:
        return

    def refuse(self: subprocess.Popen[bytes], args: object, *rest: object, **kw: object) -> None:
        raise AssertionError(f"{request.node.nodeid} started a process ({args!r}) in the unit tier: mark the test "
                             "`integration` (it needs a real process) or give it a fake")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


@pytest.fixture(scope="session", autouse=True)
def _state_dir_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests that do not choose a state dir get a fresh one: never the checkout's ./.alignflow (which a developer's
    own runs use), and never one an earlier test filled - so a test passes alone and in any order."""
    if os.environ.get("ALIGNFLOW_STATE_DIR"):
        yield
        return
    os.environ["ALIGNFLOW_STATE_DIR"] = str(tmp_path_factory.mktemp("alignflow-state"))
    try:
        yield
    finally:
        os.environ.pop("ALIGNFLOW_STATE_DIR", None)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One Prefect test harness (a temporary API server, ~9 s to start) for the whole session."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.logging.configuration import setup_logging
    from prefect.testing.utilities import prefect_test_harness

    # Prefect binds its console handlers to the sys.stderr of the moment it first configures logging; if that was
    # inside a typer CliRunner call of an earlier test (its streams are closed afterwards), every later log line
    # raises "I/O operation on closed file". Rebind them to this session's streams.
    setup_logging(incremental=False)
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def prefect_api_url(prefect_harness: None) -> str:
    """The harness server's API URL, for `alignflow` command lines run as subprocesses.

    A command line given PREFECT_API_URL uses that server; without it, `alignflow run` starts a server of its own
    for the run (~15 s of CPU on a new state dir, for its migrations). Tests about that per-run server leave the
    variable unset; every other test's runs share this one.
    """
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the Prefect harness did not set PREFECT_API_URL"
    return str(url)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for child processes that must import *this* checkout's alignflow."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def ssh_lab() -> Iterator[SSHLab]:
    """Real sshd servers on 127.0.0.11/.12/.13 (lab hosts ascend, cpu, cuda), one Unix user each.

    Needs root; fails (never skips) without it, because these tests must run in CI.
    """
    from tests.lab.sshd import LabUnavailable, SSHLab

    try:
        lab = SSHLab.start()
    except LabUnavailable as exc:
        pytest.fail(f"SSH lab unavailable: {exc}")
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="session")
def lab_hosts_yaml(ssh_lab: SSHLab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hosts.yaml describing the SSH lab's three hosts."""
    return ssh_lab.write_hosts_yaml(tmp_path_factory.mktemp("lab") / "hosts.yaml")


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[SlurmLab]:
    """A real Slurm cluster (munged, slurmctld, two slurmds: a 2-CPU node, and a node of its own for jobs waiting
    out a time limit) in a private network namespace.

    Needs root and Debian's slurm-wlm + munge; fails (never skips) without them, because these tests must run in CI.
    """
    from tests.lab.slurm import LabUnavailable, SlurmLab

    try:
        lab = SlurmLab.start()
    except LabUnavailable as exc:
        pytest.fail(f"Slurm lab unavailable: {exc}")
    try:
        yield lab
    finally:
        lab.close()
