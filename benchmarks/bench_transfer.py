"""Transfer and latency figures for the SSH transport, measured on the SSH lab (real sshd on loopback).

    python benchmarks/bench_transfer.py [--size-mib 1024] [--files 8] [--rounds 5]

Prints:
- host -> host copy of a directory (ascend -> cpu) through `copy_between` (route "direct": rsync on the
  source host, sha256 of the source memoized as in the pipeline, verified on the destination before the
  rename) against plain `rsync -a -e ssh` run on the source host to the destination, interleaved rounds in
  the same run (order alternating, `sync` before each copy); goal: alignflow >= 0.85x rsync's throughput.
  Also: the same copy given `expected=` (the fingerprint the store recorded, as the flow passes it: the
  source is not re-hashed), rsync with alignflow's preferred cipher (like for like), the relay route and a
  cold source hash.
- median latency of a trivial command on a warm connection (goal <= 50 ms) and on a cold one (connect,
  authenticate, run, close).

Needs root (the lab creates Unix users and runs sshd). Loopback figures are CPU-bound: they show overhead
relative to rsync, not what a real network gives.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alignflow.transport import SSHShell, Transport, copy_between, open_transport
from alignflow.transport.direct import DirectRoute
from tests.lab.sshd import SSHLab

_MAKE_DATA = """
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root, exist_ok=True)
block = 1 << 20
for i in range(n):
    with open(os.path.join(root, f"shard-{i:03d}.bin"), "wb") as fh:
        for _ in range(size // block):
            fh.write(os.urandom(block))
"""


def _baseline(src: Transport, dst: Transport, src_dir: str, dst_dir: str, cipher: str | None = None) -> float:
    """Plain `rsync -a -e ssh` on the source host (no hashing, no staging), with the same lent key."""
    with DirectRoute(src.files, dst.files) as route:
        assert route.usable(), route.reason
        h = dst.host
        rsh = (f"ssh -F /dev/null -o StrictHostKeyChecking=yes -o UserKnownHostsFile={route.known_hosts_file}"
               f" -o BatchMode=yes -p {h.port} -l {h.user}" + (f" -c {cipher}" if cipher else ""))
        cmd = ["rsync", "-a", "-e", rsh, src_dir + "/", f"{h.address}:{dst_dir}/"]
        argv = route.ssh.ssh_argv(shlex.join(cmd), forward_agent=True)
        start = time.perf_counter()
        subprocess.run(argv, env=route.env(), check=True, capture_output=True)
        return time.perf_counter() - start


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="total size of the directory copied")
    parser.add_argument("--files", type=int, default=8, help="files in the directory")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of each method")
    args = parser.parse_args()
    size = args.size_mib << 20
    lab = SSHLab.start(("ascend", "cpu"))
    try:
        with open_transport(lab.host("ascend")) as a, open_transport(lab.host("cpu")) as c:
            assert isinstance(a.shell, SSHShell)
            assert isinstance(c.shell, SSHShell)
            print(f"making {args.size_mib} MiB in {args.files} files on ascend ...", flush=True)
            a.run([a.python(), "-c", _MAKE_DATA, "data", str(args.files), str(size // args.files)])
            src = a.path("data")
            t_hash_cold = _timed(lambda: a.sha256([src]))
            recorded = a.sha256([src])[src]  # what the store holds for the artifact once its step has run
            c.mkdir("in")
            times: dict[str, list[float]] = {"rsync": [], "rsync-aes": [], "alignflow": [], "af-expected": [],
                                             "relay": []}
            for r in range(args.rounds):
                methods = {
                    "rsync": lambda r=r: _baseline(a, c, src, c.path(f"in/rsync-{r}")),
                    "rsync-aes": lambda r=r: _baseline(a, c, src, c.path(f"in/aes-{r}"), "aes128-gcm@openssh.com"),
                    "alignflow": lambda r=r: _timed(lambda: copy_between(a, "data", c, f"in/af-{r}", route="direct")),
                    "af-expected": lambda r=r: _timed(lambda: copy_between(a, "data", c, f"in/afx-{r}",
                                                                         expected=recorded, route="direct")),
                    "relay": lambda r=r: _timed(lambda: copy_between(a, "data", c, f"in/relay-{r}", route="relay")),
                }
                order = ["rsync", "rsync-aes", "alignflow", "af-expected", "relay"]
                order = order if r % 2 == 0 else order[::-1]
                for key in order:
                    os.sync()  # no dirty pages of the previous copy written back during this one
                    times[key].append(methods[key]())
                c.run(["rm", "-rf", f"in/rsync-{r}", f"in/aes-{r}", f"in/af-{r}", f"in/afx-{r}", f"in/relay-{r}"])
                print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
            mbps = {k: size / statistics.median(v) / 1e6 for k, v in times.items()}
            best = {k: size / min(v) / 1e6 for k, v in times.items()}
            print(f"\nhost -> host, {args.size_mib} MiB in {args.files} files, median of {args.rounds} rounds "
                  f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
            print(f"  plain rsync -a -e ssh (on the source): {mbps['rsync']:8.1f} MB/s  (OpenSSH's default cipher)")
            print(f"  same, ssh -c aes128-gcm@openssh.com  : {mbps['rsync-aes']:8.1f} MB/s  "
                  f"(alignflow's first cipher) -> alignflow = {mbps['alignflow'] / mbps['rsync-aes']:.2f}x this")
            print(f"  alignflow copy_between (direct)      : {mbps['alignflow']:8.1f} MB/s  "
                  f"= {mbps['alignflow'] / mbps['rsync']:.2f}x rsync (goal >= 0.85x)")
            print(f"  same, with expected= (from the store): {mbps['af-expected']:8.1f} MB/s  "
                  f"= {mbps['af-expected'] / mbps['rsync']:.2f}x rsync, "
                  f"{mbps['af-expected'] / mbps['rsync-aes']:.2f}x rsync-aes")
            print(f"  alignflow copy_between (relay)       : {mbps['relay']:8.1f} MB/s  "
                  f"= {mbps['relay'] / mbps['rsync']:.2f}x rsync")
            print(f"  source sha256, cold memo (once)      : {size / t_hash_cold / 1e6:8.1f} MB/s")
            print("  best round: " + ", ".join(f"{k} {v:.1f} MB/s" for k, v in best.items())
                  + f" -> alignflow = {best['alignflow'] / best['rsync']:.2f}x rsync, "
                  f"{best['alignflow'] / best['rsync-aes']:.2f}x rsync-aes")

            warm = [_timed(lambda: a.run(["true"])) for _ in range(50)]
        cold = []
        for _ in range(10):
            def once() -> None:
                with open_transport(lab.host("ascend")) as t:
                    t.run(["true"])
            cold.append(_timed(once))
        print("\ntrivial command `true` on ascend")
        print(f"  warm connection: median {statistics.median(warm) * 1e3:7.1f} ms (goal <= 50 ms)")
        print(f"  cold connection: median {statistics.median(cold) * 1e3:7.1f} ms (connect + auth + workdir + run)")
    finally:
        lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
