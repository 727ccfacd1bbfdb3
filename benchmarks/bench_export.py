"""Time of `alignflow export RUN --mlflow` as a user runs it (issue 40): into a fresh SQLite tracking store, and
into the store it left (the state dir's default store, kept between exports).

Each export is the whole command in a fresh process (MLflow's import is part of what a user waits for), on a run
recorded as the pipeline records one (tests/recorded_run.py, with its report). Baseline measured in the same run:
the first export into a fresh store, where MLflow creates its schema (its Alembic migrations) - what every export
paid when it was pointed at a new `sqlite:///` file. The printed ratio says what keeping the store saves. Wall
and CPU (user + sys) seconds of the command, medians; on a loaded machine quote the CPU figures.

    python benchmarks/bench_export.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.recorded_run import record_run  # noqa: E402


def export(run_id: str, db_url: str, state: Path) -> tuple[float, float]:
    """(wall s, cpu s) of one `alignflow export RUN --mlflow` in its own process."""
    env = {**os.environ, "ALIGNFLOW_DB_URL": db_url, "ALIGNFLOW_STATE_DIR": str(state),
           "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "alignflow", "export", run_id, "--mlflow"], env=env, check=True,
                   capture_output=True, timeout=900)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def forget(state: Path, run_id: str) -> None:
    """Delete the exported MLflow runs (not timed), so the run can be exported into the kept store again."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")
    for r in client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string=f"tags.`alignflow.run_id` = '{run_id}'"):
        client.delete_run(r.info.run_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        recorded = record_run(root / "run")
        fresh: list[tuple[float, float]] = []
        kept: list[tuple[float, float]] = []
        for i in range(args.repeat):
            state = root / f"state{i}"
            fresh.append(export(recorded.run_id, recorded.url, state))
            forget(state, recorded.run_id)
            kept.append(export(recorded.run_id, recorded.url, state))
        for name, rows in (("fresh store (baseline)", fresh), ("kept store", kept)):
            wall, cpu = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
            print(f"{name:24s} wall {wall:6.2f} s   cpu {cpu:6.2f} s")
        ratio_wall = statistics.median(k[0] / f[0] for f, k in zip(fresh, kept, strict=True))
        ratio_cpu = statistics.median(k[1] / f[1] for f, k in zip(fresh, kept, strict=True))
        print(f"kept / fresh: wall {ratio_wall:.2f}x, cpu {ratio_cpu:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
