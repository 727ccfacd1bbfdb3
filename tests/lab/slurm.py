"""The Slurm lab: a real Slurm cluster on this machine (munged, slurmctld, a slurmd per node), for the tests.

```
<lab>/slurm.conf        generated; cgroup-free (proctrack/linuxproc, task/none), no accounting daemon
<lab>/munge/            munged's key and socket (AuthInfo=socket=...)
<lab>/state, spool, log slurmctld's state, the slurmds' spools, the daemons' logs
nodes                   aflab-node (2 CPUs), aflab-clock (1 CPU, for jobs that wait out a time limit)
partitions              debug (default, PriorityTier 1), urgent (PriorityTier 2: preempts debug, PreemptMode=CANCEL),
                        both on aflab-node; clock, on aflab-clock alone
```

The daemons run in a private network namespace (`tests.lab.netns`): Slurm 22.05 binds every interface and has
no setting to change that, so the namespace's loopback is all they can listen on; a forwarder on 127.0.0.1 of
the machine relays the controller's one port, which is all the clients (sbatch, squeue, scontrol, scancel, sacct)
talk to. Jobs run inside the namespace too, so `close()` ends every daemon and job the lab started.

Clients find the cluster through `SLURM_CONF` (`env()`: put it in a host's `env:`). There is no slurmdbd (it
needs a MySQL server): `sacct` is installed and answers "Slurm accounting storage is disabled", so job states come
from the controller while it remembers the job (`MinJobAge`) and from the job's own files after that.

Needs root and Debian's slurm-wlm + munge (`.ci/run` installs them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.config.hosts import Host
from tests.lab.netns import NetNamespace, reap_stale

NODE = "aflab-node"
CPUS = 2
# A second node, alone in its partition, for jobs that must wait out Slurm's clock (a one-minute time limit is the
# shortest there is) while the other tests use NODE: its own slurmd (`slurmd -N`), port and spool.
CLOCK_NODE, CLOCK_PARTITION = "aflab-clock", "clock"
MAIN_PARTITIONS = ("debug", "urgent")  # NODE's
BINARIES = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "squeue", "scontrol", "scancel", "sacct",
            "sinfo", "unshare", "nsenter", "ip")
_PREFIX = "alignflow-slurmlab-"


class LabUnavailable(RuntimeError):
    """The lab cannot start here; the message says what to install or how to run."""


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_version() -> str:
    done = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


class SlurmLab:
    """Start with `SlurmLab.start()`, stop with `close()`."""

    def __init__(self, root: Path, ns: NetNamespace, port: int) -> None:
        self.root, self.ns, self.port = root, ns, port
        self.conf = root / "slurm.conf"
        self.daemons: dict[str, _Daemon] = {}

    # -- lifecycle -----------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, *, min_job_age_s: int = 300) -> SlurmLab:
        if os.geteuid() != 0:
            raise LabUnavailable("the Slurm lab needs root (its daemons run as root in a network namespace); run "
                                 "the tests as root (CI does)")
        missing = [b for b in BINARIES if shutil.which(b) is None]
        if missing:
            raise LabUnavailable(f"missing {', '.join(missing)}: install slurm-wlm, munge and util-linux/iproute2 "
                                 "(.ci/run does)")
        reap_stale(f"{_PREFIX}*", lambda lab: (lab / "owner").exists() and _pid_alive(lab / "owner"))
        root = Path(tempfile.mkdtemp(prefix=_PREFIX))
        root.chmod(0o711)  # lab users read slurm.conf and reach munge's socket
        (root / "owner").write_text(str(os.getpid()))
        ns = NetNamespace.start()
        (root / "netns").write_text(str(ns.inode))
        lab = cls(root, ns, _free_port())
        try:
            lab._start_munge()
            lab.conf.write_text(lab.render_conf(min_job_age_s=min_job_age_s))
            lab.conf.chmod(0o644)
            lab._start("slurmctld", ["slurmctld", "-D", "-f", str(lab.conf)])
            ns.forward("127.0.0.1", lab.port, ("127.0.0.1", lab.port))
            for node in (NODE, CLOCK_NODE):
                lab._start(f"slurmd-{node}", ["slurmd", "-D", "-f", str(lab.conf), "-N", node])
            lab.wait_idle()
        except BaseException:
            lab.close()
            raise
        return lab

    def _start_munge(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(mode=0o755, exist_ok=True)
        d = self.root / "munge"
        d.mkdir(mode=0o711)
        key = d / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        sock = d / "munge.socket"
        self._start("munged", ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                               f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}",
                               f"--log-file={d / 'munged.log'}"])
        deadline = time.monotonic() + 10
        while not sock.exists():
            self._check_alive("munged")
            if time.monotonic() > deadline:
                raise LabUnavailable("munged did not create its socket")
            time.sleep(0.05)

    def _start(self, name: str, argv: list[str]) -> None:
        log = self.root / "log" / f"{name}.out"
        log.parent.mkdir(exist_ok=True)
        with log.open("wb") as out:
            proc = self.ns.popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, "SLURM_CONF": str(self.conf)})
        self.daemons[name] = _Daemon(name, proc, log)

    def _check_alive(self, name: str) -> None:
        d = self.daemons[name]
        if d.process.poll() is not None:
            tail = d.log.read_text(errors="replace")[-3000:]
            raise LabUnavailable(f"{name} exited {d.process.returncode}:\n{tail}")

    def render_conf(self, *, min_job_age_s: int) -> str:
        r = self.root
        munge_socket = r / "munge" / "munge.socket"
        return "\n".join([
            "# alignflow Slurm lab: two nodes, no cgroups, no accounting daemon",
            "ClusterName=aflab",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={self.port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=CANCEL",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            f"MinJobAge={min_job_age_s}",
            "KillWait=5",
            "Waittime=0",
            "DebugFlags=NO_CONF_HASH",
            f"NodeName={NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={self.port + 1} CPUs={CPUS} "
            "RealMemory=2000 State=UNKNOWN",
            f"NodeName={CLOCK_NODE} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={self.port + 2} "
            "CPUs=1 RealMemory=500 State=UNKNOWN",
            f"PartitionName={MAIN_PARTITIONS[0]} Nodes={NODE} Default=YES MaxTime=INFINITE PriorityTier=1 State=UP",
            f"PartitionName={MAIN_PARTITIONS[1]} Nodes={NODE} MaxTime=INFINITE PriorityTier=2 State=UP",
            f"PartitionName={CLOCK_PARTITION} Nodes={CLOCK_NODE} MaxTime=INFINITE PriorityTier=1 State=UP",
            "",
        ])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.scancel_all()
        self.ns.close()
        for d in self.daemons.values():
            with contextlib.suppress(Exception):
                d.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- driving the cluster -------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What a client needs to find this cluster (a host's `env:`)."""
        return {"SLURM_CONF": str(self.conf)}

    def client(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against the lab (from the machine, like a user would)."""
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                              env={**os.environ, **self.env()})
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def node_state(self) -> str:
        return self.client(["sinfo", "-h", "-n", NODE, "-o", "%T"]).stdout.strip()

    def wait_idle(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            for name in self.daemons:
                self._check_alive(name)
            done = self.client(["sinfo", "-h", "-n", f"{NODE},{CLOCK_NODE}", "-o", "%T"], check=False)
            state = done.stdout.strip()
            if done.returncode == 0 and state == "idle":
                return
            time.sleep(0.3)
        raise LabUnavailable(f"nodes {NODE}, {CLOCK_NODE} are not idle after {timeout_s:g} s (state {state!r}); see "
                             f"{self.root / 'log'}")

    def hold_node(self) -> None:
        """Drain the node: new jobs stay PENDING (reason `ReqNodeNotAvail` / `Resources`) until `release_node`."""
        self.client(["scontrol", "update", f"nodename={NODE}", "state=drain", "reason=alignflow-lab-hold"])

    def release_node(self) -> None:
        self.client(["scontrol", "update", f"nodename={NODE}", "state=resume"])

    def jobs(self, *, every: bool = False) -> list[str]:
        """`<id> <state>` of the jobs Slurm knows on the node the tests share (`every`: the clock node's too, whose
        job runs beside them)."""
        where = [] if every else ["-p", ",".join(MAIN_PARTITIONS)]
        out = self.client(["squeue", "-h", "-o", "%i %T", *where]).stdout
        return [line for line in out.splitlines() if line.strip()]

    def scancel_all(self) -> None:
        ids = [line.split()[0] for line in self.jobs(every=True)]
        if ids:
            self.client(["scancel", *ids], check=False)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if all(line.split()[1] not in ("RUNNING", "PENDING", "COMPLETING") for line in self.jobs(every=True)):
                    break
                time.sleep(0.2)

    def host(self, name: str = "cuda", *, role: str = "cuda", workdir: str | Path, **slurm: Any) -> Host:
        """A local Slurm host of this cluster (its commands run on this machine, its jobs on the lab's node)."""
        fields: dict[str, Any] = {"name": name, "role": role, "transport": "local", "workdir": str(workdir),
                                  "scheduler": "slurm", "slurm": {"partition": "debug", **slurm},
                                  "env": self.env()}
        return Host(**fields)


def _pid_alive(owner_file: Path) -> bool:
    try:
        pid = int(owner_file.read_text().strip())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()
