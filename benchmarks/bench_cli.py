"""How fast the command line answers: `alignflow --help`, `validate` of the demo and a configuration error.

Goals (issue 48, on an idle 2-core machine): `--help` <= 0.3 s, `validate experiments/demo.yaml` <= 0.6 s. The
machine is often shared, so each figure is also printed as a ratio to `python -c pass` measured in the same run
(the interpreter's own start-up, the floor every command adds to), with the CPU time the command used (user + system,
which a loaded machine inflates far less than the wall time) and the number of modules it loads (`sys.modules` at
exit; tests/cli/test_imports.py holds the list to a named set).

    python benchmarks/bench_cli.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOALS_S = {"--help": 0.3, "validate experiments/demo.yaml": 0.6}
COMMANDS = ("--help", "validate experiments/demo.yaml", "run experiments/demoo.yaml")
# The command run in-process with `sys.modules` printed at exit (how many modules a command loads).
_PROBE = """
import atexit, runpy, sys
atexit.register(lambda: sys.__stderr__.write(f"\\nmodules={len(sys.modules)}\\n"))
sys.argv = ["alignflow", *sys.argv[1:]]
runpy.run_module("alignflow", run_name="__main__")
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    # As a user's python runs: bytecode cached (a warm-up run writes it), else each run compiles alignflow's modules.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("ALIGNFLOW_STATE_DIR", str(ROOT / ".alignflow"))
    return env


def timed(argv: list[str], repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of `repeat` runs of argv (output discarded), after one run that is not counted
    (warm-up)."""
    walls, cpus = [], []
    for _ in range(repeat + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return walls[1:], cpus[1:]


def modules_loaded(args: list[str]) -> int:
    """How many modules `alignflow ARGS` has loaded when it exits."""
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, check=False)
    return int(done.stderr.rsplit("modules=", 1)[1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    repeat = parser.parse_args().repeat
    floor, floor_cpu = timed([sys.executable, "-c", "pass"], repeat)
    base = statistics.median(floor)
    print(f"load average {os.getloadavg()[0]:.2f}; {repeat} runs each; ratio = median / median of `python -c pass`")
    print(f"{'command':40} {'min s':>7} {'median s':>9} {'ratio':>6} {'cpu s':>6} {'modules':>8} {'goal s':>7}")
    print(f"{'python -c pass':40} {min(floor):7.3f} {base:9.3f} {1.0:6.1f} {statistics.median(floor_cpu):6.3f} "
          f"{'':>8} {'':>7}")
    for command in COMMANDS:
        args = command.split()
        times, cpu = timed([sys.executable, "-m", "alignflow", *args], repeat)
        goal = GOALS_S.get(command)
        print(f"{'alignflow ' + command:40} {min(times):7.3f} {statistics.median(times):9.3f} "
              f"{statistics.median(times) / base:6.1f} {statistics.median(cpu):6.3f} {modules_loaded(args):8d} "
              f"{'' if goal is None else f'{goal:.1f}':>7}")


if __name__ == "__main__":
    main()
