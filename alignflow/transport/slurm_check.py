"""Is a `scheduler: slurm` host usable? Its client tools, its controller, its partition, its accounting.

Run before anything is submitted (the run's preflight, `alignflow doctor`): a host without `sacct` cannot tell
how a job ended once the controller has forgotten it (`MinJobAge`, 300 s by default) - a re-attach after a long
controller outage would find nothing - so it is an error, like a missing sbatch. Accounting that is installed
but disabled (no slurmdbd) is a warning: the job's own exit_code file still says how it exited, not whether
Slurm ended it (TIMEOUT, PREEMPTED).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from alignflow.transport import commands
from alignflow.transport.shell import Shell
from alignflow.transport.slurm_login import SlurmLoginShell

TOOLS = ("sbatch", "scontrol", "scancel", "sacct", "sinfo")

_CHECK_SH = """\
for c in "$@"; do command -v "$c" > /dev/null 2>&1 || echo "MISSING $c"; done
if command -v sinfo > /dev/null 2>&1; then
  out=$(sinfo -h -o '%R' 2>&1); rc=$?
  if [ "$rc" = 0 ]; then printf '%s\\n' "$out" | sed 's/^/PARTITION /'; else printf 'SINFO %s\\n' "$out" | head -n 3; fi
fi
if command -v sacct > /dev/null 2>&1; then
  out=$(sacct -n -X -j 1 -o JobID 2>&1) || printf 'SACCT %s\\n' "$out" | head -n 3
fi
exit 0
"""


@dataclass(frozen=True, slots=True)
class SlurmCheck:
    host: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)


def check_slurm_host(shell: Shell) -> SlurmCheck:
    """What stands in the way of running the host's jobs through Slurm (errors), and what weakens it (warnings);
    asked on the host's login node (`shell`: how hosts.yaml reaches it)."""
    host = shell.host
    assert host.slurm is not None
    raw = SlurmLoginShell(shell).exec(commands.script("slurm-check", _CHECK_SH, *TOOLS), timeout_s=120)
    check = SlurmCheck(host.name)
    lines = raw.text().splitlines()
    missing = [line.split(" ", 1)[1] for line in lines if line.startswith("MISSING ")]
    if missing:
        why = " (it tells how a job ended once the controller forgot it)" if "sacct" in missing else ""
        check.errors.append(f"{host.name}: Slurm host without {', '.join(missing)}{why}; install Slurm's client "
                            "tools there, or fix PATH with the host's env/setup")
    check.partitions.extend(line.split(" ", 1)[1].strip().rstrip("*") for line in lines
                            if line.startswith("PARTITION "))
    sinfo = [line[len("SINFO "):] for line in lines if line.startswith("SINFO ")]
    if sinfo:
        check.errors.append(f"{host.name}: the Slurm controller does not answer sinfo: {' | '.join(sinfo)}")
    wanted = host.slurm.partition
    if wanted and check.partitions and wanted not in check.partitions:
        check.errors.append(f"{host.name}: slurm.partition {wanted!r} does not exist; the cluster has: "
                            f"{', '.join(sorted(set(check.partitions)))}")
    sacct = " | ".join(line[len("SACCT "):] for line in lines if line.startswith("SACCT "))
    if "disabled" in sacct:
        check.warnings.append(f"{host.name}: Slurm accounting is disabled ({sacct}): once the controller forgets "
                              "a job, only its exit_code file tells how it ended")
    elif sacct:
        check.warnings.append(f"{host.name}: sacct does not answer: {sacct}")
    return check
