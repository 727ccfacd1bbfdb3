"""Fixtures of the deployment tests: the team topology (PostgreSQL, Prefect server, `alignflow serve`) for real.

`team` starts, once per module that asks for it:

- the session's PostgreSQL lab server with two new databases, `prefect_<hex>` (Prefect's) and `alignflow_<hex>`
  (the store), as docker/compose.yaml puts both on one server;
- `prefect server start` on 127.0.0.1 with its database on PostgreSQL (asyncpg);
- a static file server for the state dir's `reports/` (compose's `reports` service), so report links resolve;
- `alignflow serve` in a workspace holding `experiments/demo.yaml` (the repository's demo cut to one MoE layer
  and 4 + 8 steps), `drifting.yaml` (the same experiment under another name) and the repository's `hosts.yaml`
  (three local hosts).

Teardown stops every process (SIGTERM, then SIGKILL by process group) and drops both databases.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.deploy.team import PrefectServer, Proc, free_port, wait_until
from tests.lab.postgres import PostgresServer


@dataclass
class Team:
    root: Path
    server: PrefectServer
    serve: Proc
    reports: Proc
    reports_url: str
    db_url: str
    state: Path
    env: dict[str, str]  # what `alignflow serve` runs with (API URL, store, state dir, reports URL)

    @property
    def experiments(self) -> Path:
        return self.root / "experiments"


def write_workspace(root: Path, repo_root: Path) -> None:
    """experiments/ and the repository's hosts.yaml.

    `demo` is the repository's demo (its data made under the state dir and checked against its sha256, its
    criteria, its learning-rate schedule) at the depth of tests/data/flow/tiny.yaml: one MoE layer and 4 + 8 steps
    instead of 4 layers and 10 + 30, whose trainings cost about 30 CPU-s more per run (process accounting: 54
    against 21) and change nothing the deployment does (the demo itself is `make demo`'s, which CI runs).
    `drifting` is the same experiment under another name: the nightly finds its trainings already made by the UI's
    demo run, and its test then makes it regress.
    """
    (root / "experiments").mkdir(parents=True)
    demo = yaml.safe_load((repo_root / "experiments" / "demo.yaml").read_text())
    demo["model"]["num_layers"] = 1
    demo["model"]["moe"]["layer_freq"] = [1]
    demo["training"].update(base_steps=4, steps=8, lr_warmup_iters=2)
    (root / "experiments" / "demo.yaml").write_text(yaml.safe_dump(demo, sort_keys=False))
    drifting = {**demo, "name": "drifting", "description": "The demo under another name, made to regress."}
    (root / "experiments" / "drifting.yaml").write_text(yaml.safe_dump(drifting, sort_keys=False))
    # The repository's three local hosts; the NPU host takes two jobs at once here because the cancellation test
    # trains a UI launch and a nightly side by side on it (one slot would queue the second behind the first).
    hosts = yaml.safe_load((repo_root / "hosts.yaml").read_text())
    hosts["hosts"]["ascend"]["max_concurrent_jobs"] = 2
    (root / "hosts.yaml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    # the nightly exports each of its runs to TensorBoard (a relative dir: under the state dir)
    (root / "nightly.yaml").write_text(yaml.safe_dump({"export": {"tensorboard": "exports/tensorboard"}}))


def serve_env(base: dict[str, str], *, api_url: str, db_url: str, state: Path, home: Path,
              reports_url: str) -> dict[str, str]:
    return {**base, "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home), "ALIGNFLOW_DB_URL": db_url,
            "ALIGNFLOW_STATE_DIR": str(state), "ALIGNFLOW_REPORTS_URL": reports_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "GLOG_v": "3"}  # serve polls for due runs every 2 s


@pytest.fixture(scope="module")
def team(postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory, repo_root: Path,
         subprocess_env: dict[str, str]) -> Iterator[Team]:
    root = tmp_path_factory.mktemp("team")
    write_workspace(root, repo_root)
    suffix = secrets.token_hex(4)
    prefect_db, store_db = f"prefect_{suffix}", f"alignflow_{suffix}"
    postgres_server.create_database(prefect_db)
    db_url = postgres_server.create_database(store_db)
    state = root / "state"
    (state / "reports").mkdir(parents=True)
    started: list[Proc] = []
    server: PrefectServer | None = None
    try:
        server = PrefectServer.start(
            database_url=postgres_server.url(prefect_db).replace("+psycopg", "+asyncpg"),
            home=root / "prefect-server", env=subprocess_env, log=root / "logs" / "prefect-server.log")
        started.append(server.proc)
        port = free_port()
        reports = Proc.start("reports", [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                                         str(state / "reports"), str(port)],
                             env=subprocess_env, cwd=root, log=root / "logs" / "reports.log")
        started.append(reports)
        reports_url = f"http://127.0.0.1:{port}"
        env = serve_env(subprocess_env, api_url=server.api_url, db_url=db_url, state=state,
                        home=root / "prefect-serve", reports_url=reports_url)
        serve = Proc.start("alignflow serve", [sys.executable, "-m", "alignflow", "serve"], env=env, cwd=root,
                           log=root / "logs" / "serve.log")
        started.append(serve)
        for flow_name, name in (("alignment", "launch"), ("nightly-regression", "nightly")):
            wait_until(f"deployment {flow_name}/{name}", lambda f=flow_name, n=name: server.deployment(f, n),
                       timeout_s=120, proc=serve)
        yield Team(root=root, server=server, serve=serve, reports=reports, reports_url=reports_url, db_url=db_url,
                   state=state, env=env)
    finally:
        for proc in reversed(started):
            proc.stop()
        if server is not None:
            server.client.close()
        postgres_server.drop_database(prefect_db)
        postgres_server.drop_database(store_db)
