"""A fully cached `alignflow run demo` against a kept Prefect server, beside the floor it adds to (issue 48).

    python benchmarks/bench_cached.py [--runs 10] [--state DIR]

Fills a state dir with one real run of the demo (about a minute on 2 cores; skipped when `--state` names a dir
that already holds a completed run), starts `alignflow server start`, then times `--runs` rounds of three commands,
interleaved so that a loaded machine weighs on each alike:

- `python -c 'import prefect'`: Prefect's import, paid by any command that talks to Prefect;
- a no-op flow run (`@flow def noop(): pass`) against the same kept server: the floor of any flow run;
- `alignflow run demo --quiet`, every step cached (exit 0, each step `cached`, checked).

Printed: min, median and p90 (nearest rank) of each, wall and CPU (user + sys of the child), and what alignflow
adds to the no-op floor. Goal (issue 48): cached p90 <= 3 s and within 1.5 s of the no-op flow run's p90.

Wall times cluster about whole seconds: Prefect (3.9) runs a flow run's heartbeat in a thread that sleeps in 1 s
steps (`flows.heartbeat_frequency`, 180 s by default), and the engine joins it as the flow run ends, so a flow run
lasts until the next whole second after its body began, the no-op's included (0 to 1 s more). A flow body that
crosses a second on a loaded machine costs a whole second of wall; CPU figures do not jump so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

NOOP_FLOW = """
from prefect import flow

@flow(name="noop")
def noop() -> None:
    pass

noop()
"""


def child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU seconds of one command (its output captured)."""
    cpu0, t0 = child_cpu_s(), time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    return time.perf_counter() - t0, child_cpu_s() - cpu0, done


def alignflow(env: dict[str, str], *args: str) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    return timed([sys.executable, "-m", "alignflow", *args], env)


def must(label: str, done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        print(f"{label}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}", file=sys.stderr)
        raise SystemExit(1)


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]  # nearest rank: the 9th of 10


def summary(values: list[float]) -> str:
    return f"min {min(values):5.2f}  median {statistics.median(values):5.2f}  p90 {p90(values):5.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="rounds timed (default 10)")
    ap.add_argument("--state", type=Path, help="a state dir to use (and keep); default: a fresh one, removed")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-cached-"))
    state = args.state.resolve() if args.state else root / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # timed as users run it: with the checkout's bytecode cached
    env.update(ALIGNFLOW_STATE_DIR=str(state), PREFECT_HOME=str(state / "prefect" / "home"), DO_NOT_TRACK="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        _, _, done = alignflow(env, "history", "--json", "--experiment", "demo")
        must("alignflow history", done)
        filled = any(r["status"] == "completed" for r in json.loads(done.stdout))
        if not filled:
            wall, _, done = alignflow(env, "run", "demo", "--quiet")
            must("filling the cache: alignflow run demo", done)
            print(f"cache filled: alignflow run demo in {wall:.1f} s ({state})")
        must("alignflow server start", alignflow(env, "server", "start")[2])
        _, _, done = alignflow(env, "server", "status", "--json")
        must("alignflow server status", done)
        url = json.loads(done.stdout)[0]["url"]
        noop_env = {**env, "PREFECT_API_URL": url}
        rows: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ("import", "noop", "cached")}
        for i in range(args.runs):
            for name, argv, run_env in (
                ("import", [sys.executable, "-c", "import prefect"], env),
                ("noop", [sys.executable, "-c", NOOP_FLOW], noop_env),
                ("cached", [sys.executable, "-m", "alignflow", "run", "demo", "--quiet"], env),
            ):
                wall, cpu, done = timed(argv, run_env)
                must(name, done)
                if name == "cached" and "verdict PASS" not in done.stdout:
                    print(f"cached run {i + 1}: not a passing run:\n{done.stdout}", file=sys.stderr)
                    return 1
                rows[name][0].append(wall)
                rows[name][1].append(cpu)
            print(f"  round {i + 1:2d}: " + "  ".join(f"{n} {rows[n][0][-1]:5.2f} s" for n in rows), flush=True)
        labels = {"import": "python -c 'import prefect'", "noop": "no-op flow run, kept server",
                  "cached": "alignflow run demo, all cached"}
        print(f"{args.runs} rounds, seconds (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores):")
        for name, (walls, cpus) in rows.items():
            print(f"  {labels[name]:<32} wall {summary(walls)}   cpu {summary(cpus)}")
        over = p90(rows["cached"][0]) - p90(rows["noop"][0])
        print(f"  cached over the no-op floor (p90): {over:+.2f} s   (goal: cached p90 <= 3 s, within 1.5 s of it)")
    finally:
        alignflow(env, "server", "stop")
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
