"""A store client for the concurrency test: `python -m tests.store.writer URL NAME COUNT READY_FILE GO_FILE`.

Opens (and, on an empty database, migrates) the store, signals READY_FILE, waits for GO_FILE so that both
writers start together, then records COUNT complete runs (step, job, artifact, metrics, verdict), meeting the
other writer halfway, and prints the run ids as JSON.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import pandas as pd

from alignflow.store import Store
from tests.store.sample import run_params


def _meet_the_other_writer(store: Store, name: str, deadline: float) -> bool:
    """Wait (halfway) until the other writer has recorded a run too, so that the two really write concurrently
    instead of one finishing before the other is scheduled on a busy machine."""
    while time.monotonic() < deadline:
        if any(r.trigger != name for r in store.list_runs(experiment="race", limit=1000)):
            return True
        time.sleep(0.005)
    return False


def main(argv: list[str]) -> int:
    url, name, count, ready, go = argv[0], argv[1], int(argv[2]), Path(argv[3]), Path(argv[4])
    store = Store.open(url)  # both writers may find an empty database and migrate it at the same moment
    ready.touch()
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            print(f"{name}: no go signal within 120 s", file=sys.stderr)
            return 3
        time.sleep(0.005)
    store.ensure_experiment("race", config={"writers": 2}, config_sha256="d" * 64)
    ids = []
    for i in range(count):
        run = store.create_run("race", trigger=name, code_version="v", params=run_params("race"))
        step = store.start_step(run.id, "convert_bf16", host=name, command="convert", cache_key=f"{name}-{i}",
                                inputs={})
        store.attach_job(step.id, job_dir=f"jobs/{name}/{i}", handle={"pid": i})
        store.add_artifact(step.id, name="bf16_ckpt", host=name, path=f"out/{name}/{i}", kind="dir",
                           sha256=hashlib.sha256(f"{name}{i}".encode()).hexdigest(), size_bytes=i)
        store.finish_step(step.id, status="ran", exit_code=0, stdout_tail=f"{name} {i}", stderr_tail="")
        store.add_metrics(run.id, source=name, frame=pd.DataFrame({"lm_loss": [3.0, 2.0, 1.0]}, index=[1, 2, 3]))
        store.finish_run(run.id, status="completed", verdict="pass")
        ids.append(run.id)
        if i == count // 2 and not _meet_the_other_writer(store, name, deadline):
            print(f"{name}: the other writer never wrote within 120 s", file=sys.stderr)
            return 3
    store.close()
    print(json.dumps(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
