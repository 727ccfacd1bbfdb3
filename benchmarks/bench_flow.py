"""Orchestration overhead of the alignment flow, with Prefect's one-time start reported separately.

    python benchmarks/bench_flow.py [--steps N] [--no-ssh] [--no-demo]

1. Prefect: the time to start a temporary API server (`prefect_test_harness`; `alignflow run` pays the same cost
   for its ephemeral server), measured once.
2. Instantaneous commands: an experiment whose six steps are command overrides that finish at once (they copy
   pre-rendered checkpoints and real-format logs), run through the real flow — staging, cache keys, detached
   jobs, polling, sentinel checks, fingerprints on the hosts, the store, the comparison and its report — on the
   three local hosts and on three SSH lab hosts (real sshd; needs root). Printed: wall time per step, for a
   first (everything executes) and a second run (everything cached). Goal: <= 1 s per step over SSH.
3. The demo fully cached: `experiments/demo.yaml` run once to fill the cache (not timed), then again; goal
   <= 10 s plus Prefect's start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from alignflow.logs.render import megatron_line, mindformers_pynative_line  # noqa: E402

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


TRACKER = "latest_checkpointed_iteration.txt"


def write_fixtures(root: Path, steps: int) -> Path:
    """Pre-rendered outputs: a checkpoint-like directory and real-format logs of `steps` steps."""
    fx = root / "fixtures"
    (fx / "ckpt").mkdir(parents=True)
    (fx / "ckpt" / "latest_checkpointed_iteration.txt").write_text("1\n")
    (fx / "ckpt" / "weights.bin").write_bytes(os.urandom(1 << 20))
    npu = ["All Network parameters are loaded."]
    gpu = ["  successfully loaded checkpoint from ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 0"]
    for s in range(1, steps + 1):
        loss = 5.0 - 0.01 * s
        npu.append(mindformers_pynative_line(s, steps, loss=loss, step_time_ms=100, lr=1e-3, grad_norm=1.0,
                                             consumed_samples=4 * s, global_batch_size=4))
        gpu.append(megatron_line(s, steps, consumed_samples=4 * s, elapsed_ms=100.0, lr=1e-3, global_batch_size=4,
                                 losses={"lm loss": loss}, grad_norm=1.0, microseconds=False))
    (fx / "npu.log").write_text("\n".join(npu) + "\n")
    (fx / "gpu.log").write_text("\n".join(gpu) + "\n")
    for p in [fx, *fx.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # lab users read them as "their" framework outputs
    return fx


def experiment(root: Path, fx: Path, steps: int) -> Path:
    copy_ckpt = ["bash", "-c", 'mkdir -p "$1" && cp -r "$2"/. "$1"/ && cat "$3"', "x"]
    exp = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    exp.update(name="bench-flow", description="instantaneous commands")
    exp["data"] = {"path": str(root / "data.bin")}
    (root / "data.bin").write_bytes(os.urandom(4096))
    exp["training"].update(base_steps=steps, steps=steps)
    exp["steps"] = {
        "npu_base_train": {"command": [*copy_ckpt, "{out}/checkpoint", str(fx / "ckpt"), str(fx / "npu.log")]},
        "convert_bf16": {"command": [*copy_ckpt, "{out}/bf16", "{in:base_ckpt}", "/dev/null"]},
        "convert_megatron": {"command": [*copy_ckpt, "{out}/megatron", "{in:bf16_ckpt}", "/dev/null"]},
        "gpu_train": {"command": ["cat", str(fx / "gpu.log"), "{in:megatron_ckpt}/" + TRACKER]},
        "npu_reload_train": {"command": ["cat", str(fx / "npu.log"), "{in:bf16_ckpt}/" + TRACKER]},
    }
    exp["criteria"] = [{"metric": "lm_loss", "statistic": "me", "threshold": 0.001}]
    exp["preflight"] = False  # the replaced commands carry no framework settings to compare
    path = root / "bench.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


@contextmanager
def harness() -> Iterator[float]:
    from prefect.testing.utilities import prefect_test_harness

    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=120):
        yield time.perf_counter() - t0


def timed_run(exp: Path, hosts: Path, state: Path) -> tuple[float, dict[str, Any]]:
    from flows.alignment import alignment

    os.environ["ALIGNFLOW_STATE_DIR"] = str(state)
    t0 = time.perf_counter()
    record: dict[str, Any] = alignment(experiment=str(exp), hosts=str(hosts), trigger="bench")
    return time.perf_counter() - t0, record


def local_hosts(root: Path) -> Path:
    path = root / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {n: {"role": n, "transport": "local", "workdir": f"hosts/{n}"}
                                              for n in ("ascend", "cpu", "cuda")}}))
    return path


def report(label: str, seconds: float, record: dict[str, Any]) -> None:
    statuses = {s["status"] for s in record["steps"]}
    n = len(record["steps"])
    print(f"  {label:<34} {seconds:7.2f} s total  {seconds / n:6.2f} s/step  ({n} steps: {', '.join(sorted(statuses))};"
          f" verdict {record['verdict']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="log steps of the instantaneous trainings")
    ap.add_argument("--no-ssh", action="store_true", help="skip the SSH lab (needs root)")
    ap.add_argument("--no-demo", action="store_true", help="skip the cached demo re-run")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    root = Path(tempfile.mkdtemp(prefix="bench-flow-"))
    os.chmod(root, 0o755)
    try:
        fx = write_fixtures(root, args.steps)
        exp = experiment(root, fx, args.steps)
        with harness() as start_s:
            print(f"Prefect temporary server start (once): {start_s:.2f} s")
            print("instantaneous commands, local hosts:")
            hosts = local_hosts(root)
            for label in ("first run (all steps execute)", "second run (all cached)"):
                seconds, record = timed_run(exp, hosts, root / "state-local")
                report(label, seconds, record)
            if not args.no_ssh:
                from tests.lab.sshd import SSHLab

                lab = SSHLab.start()
                try:
                    print("instantaneous commands, SSH lab hosts (real sshd on 127.0.0.11-13):")
                    lab_hosts = lab.write_hosts_yaml(root / "lab-hosts.yaml")
                    for label in ("first run (all steps execute)", "second run (all cached)"):
                        seconds, record = timed_run(exp, lab_hosts, root / "state-ssh")
                        report(label, seconds, record)
                finally:
                    lab.close()
            if not args.no_demo:
                print("demo experiment (twin-moe, 30 steps per side), local hosts:")
                demo_root = root / "demo"
                demo_root.mkdir()
                shutil.copy(REPO / "experiments" / "demo.yaml", demo_root / "demo.yaml")
                demo = yaml.safe_load((demo_root / "demo.yaml").read_text())
                demo["data"]["path"] = str(demo_root / "demo.tokens")
                (demo_root / "demo.yaml").write_text(yaml.safe_dump(demo, sort_keys=False))
                demo_hosts = local_hosts(demo_root)
                seconds, record = timed_run(demo_root / "demo.yaml", demo_hosts, demo_root / "state")
                report("first run (fills the cache)", seconds, record)
                seconds, record = timed_run(demo_root / "demo.yaml", demo_hosts, demo_root / "state")
                report("fully cached re-run", seconds, record)
                print(f"  goal: cached re-run <= 10 s + Prefect start ({start_s:.1f} s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
