"""Orchestration overhead of a launch from the served deployment, against `alignflow run`, on the team topology.

    python benchmarks/bench_serve.py [--rounds 3] [--poll-s 10]

Starts what docker/compose.yaml runs, without Docker: the PostgreSQL lab server (Prefect's database and the
store's), `prefect server start` on it, and `alignflow serve` (runner poll interval `--poll-s`; Prefect's default
is 10 s). A small twin experiment runs once to fill the cache; every measured run is then fully cached (each
step reused after its fingerprints were re-verified), so the figures are orchestration, not training:

- start-up: the Prefect server to healthy; `alignflow serve` to both deployments registered;
- a launch as the UI's Run button makes it (`POST /api/deployments/{id}/create_flow_run`) until Completed,
  split into queue time (created -> running: the runner's poll) and flow time (running -> completed);
- `alignflow run` of the same experiment against the same server and store (process start included);
- the ratio launch / CLI, both measured in this run, interleaved.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.deploy.conftest import serve_env, write_workspace  # noqa: E402
from tests.deploy.team import PrefectServer, Proc, free_port, wait_until  # noqa: E402
from tests.lab.postgres import start_server, stop_server  # noqa: E402


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--poll-s", type=float, default=10.0, help="the runner's poll interval")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    write_workspace(root, ROOT)
    base_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    pg = start_server()
    started: list[Proc] = []
    try:
        suffix = secrets.token_hex(4)
        pg.create_database(f"prefect_{suffix}")
        db_url = pg.create_database(f"alignflow_{suffix}")
        t0 = time.monotonic()
        server = PrefectServer.start(database_url=pg.url(f"prefect_{suffix}").replace("+psycopg", "+asyncpg"),
                                     home=root / "prefect-server", env=base_env, log=root / "server.log")
        started.append(server.proc)
        server_start = time.monotonic() - t0
        env = serve_env(base_env, api_url=server.api_url, db_url=db_url, state=root / "state",
                        home=root / "prefect-serve", reports_url=f"http://127.0.0.1:{free_port()}")
        env["PREFECT_RUNNER_POLL_FREQUENCY"] = str(args.poll_s)
        t0 = time.monotonic()
        serve = Proc.start("alignflow serve", [sys.executable, "-m", "alignflow", "serve"], env=env, cwd=root,
                           log=root / "serve.log")
        started.append(serve)
        deployment = wait_until("alignment/launch", lambda: server.deployment("alignment", "launch"), timeout_s=120,
                                proc=serve)
        wait_until("nightly", lambda: server.deployment("nightly-regression", "nightly"), timeout_s=120, proc=serve)
        serve_start = time.monotonic() - t0
        print(f"prefect server (PostgreSQL) healthy after {server_start:.1f} s; "
              f"alignflow serve registered both deployments after {serve_start:.1f} s")

        def launch() -> tuple[float, float, float]:
            t = time.monotonic()
            created = server.run_from_ui(deployment["id"], {"experiment": "drifting"})
            created.raise_for_status()
            run = server.wait_final(created.json()["id"], timeout_s=900, proc=serve)
            wall = time.monotonic() - t
            assert run["state_type"] == "COMPLETED", run["state"]
            return wall, seconds(run["created"], run["start_time"]), seconds(run["start_time"], run["end_time"])

        def cli() -> float:
            t = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "alignflow", "run", "experiments/drifting.yaml", "--json"],
                                  env=env, cwd=root, capture_output=True, text=True, timeout=900, check=False)
            assert done.returncode == 0, done.stderr[-2000:]
            return time.monotonic() - t

        t0 = time.monotonic()
        launch()
        print(f"first launch (trains everything, fills the cache): {time.monotonic() - t0:.1f} s")
        walls, queues, flows, clis = [], [], [], []
        for i in range(args.rounds):
            order = (launch, cli) if i % 2 == 0 else (cli, launch)
            for fn in order:
                if fn is cli:
                    clis.append(cli())
                else:
                    wall, queue, flow = launch()
                    walls.append(wall)
                    queues.append(queue)
                    flows.append(flow)
        med = statistics.median
        print(f"cached launch from the deployment: {med(walls):.1f} s median over {args.rounds} "
              f"(queue {med(queues):.1f} s with a {args.poll_s:g} s poll, flow {med(flows):.1f} s)")
        print(f"cached `alignflow run` (same server, same store): {med(clis):.1f} s median")
        print(f"ratio launch / CLI: {med(walls) / med(clis):.2f}x; "
              f"flow time alone / CLI: {med(flows) / med(clis):.2f}x")
    finally:
        for proc in reversed(started):
            proc.stop()
        stop_server(pg)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
