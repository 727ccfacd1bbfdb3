"""The `slurm:` section of a host whose jobs go through Slurm (`scheduler: slurm` in hosts.yaml).

```yaml
hosts:
  h200:
    role: cuda
    transport: ssh                 # or local: the login node is this machine
    address: login.cluster.example
    user: alice
    workdir: /scratch/alice/alignflow
    scheduler: slurm
    slurm:
      partition: gpu
      account: proj-align
      qos: normal
      nodes: 1
      gpus_per_node: 8
      cpus_per_task: 16
      time_limit: "04:00:00"
      extra: ["--exclusive", "--constraint=h200"]
```

Every field becomes one `#SBATCH` line of the job's batch script (`alignflow.transport.slurm`); what is left
out is the cluster's default. The values are checked here only for shape; whether the partition, account or QOS
exist is Slurm's to say, and sbatch's refusal fails the step at once with Slurm's own message.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Slurm's time formats (sbatch --time): "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds"; https://slurm.schedmd.com/sbatch.html#OPT_time
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")
_NAME = re.compile(r"^[A-Za-z0-9_.,:+=@%-]+$")


def slurm_minutes(value: str) -> int:
    """A Slurm time limit in whole minutes, rounded up as Slurm does (`time_str2mins`)."""
    m = _TIME.match(value.strip())
    if m is None:
        raise ValueError(f"{value!r} is not a Slurm time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    days, dh, dm, ds, mins, s2, s3 = m.groups()
    if days is not None:
        seconds = int(days) * 86400 + int(dh) * 3600 + int(dm or 0) * 60 + int(ds or 0)
    elif s3 is not None:  # H:M:S
        seconds = int(mins) * 3600 + int(s2) * 60 + int(s3)
    elif s2 is not None:  # M:S
        seconds = int(mins) * 60 + int(s2)
    else:
        seconds = int(mins) * 60
    return max(1, -(-seconds // 60))


def format_minutes(minutes: int) -> str:
    """Minutes as sbatch's `D-HH:MM:SS` (or `HH:MM:SS` under a day)."""
    days, rest = divmod(minutes, 1440)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


class SlurmConfig(BaseModel):
    """What a host's jobs ask Slurm for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(None, description="`--partition`; default: the cluster's default partition.")
    account: str | None = Field(None, description="`--account` charged for the jobs.")
    qos: str | None = Field(None, description="`--qos`.")
    nodes: int = Field(1, ge=1, description="`--nodes` of a training job; one launcher (torchrun/msrun) per node.")
    gpus_per_node: int = Field(0, ge=0, description="`--gpus-per-node` (0: none asked for, a CPU job). Also the "
                               "processes per node of a multi-process training unless the host sets `devices`.")
    cpus_per_task: int | None = Field(None, ge=1, description="`--cpus-per-task` (the launcher is one task per node).")
    mem: str | None = Field(None, description="`--mem` per node, in Slurm's units (e.g. 64G); default: the "
                            "partition's.")
    time_limit: str | None = Field(
        None, description="`--time` cap, in Slurm's format (e.g. 04:00:00, 2-00:00:00). A step's own time limit "
        "(`steps.<name>.timeout_s`) is used when it is shorter; a job Slurm ends at its limit fails as TIMEOUT.")
    extra: list[str] = Field(
        default_factory=list, description="More `#SBATCH` options, one per item, e.g. `--exclusive` or "
        "`--constraint=h200`.")

    @field_validator("partition", "account", "qos", "mem")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"{value!r}: letters, digits and _ . , : + = @ % - only (it becomes an #SBATCH line)")
        return value

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            slurm_minutes(value)
        return value

    @field_validator("extra")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item.startswith("-") or any(c in item for c in "\n\r\0"):
                raise ValueError(f"extra: {item!r} must be one sbatch option starting with '-' (one per item)")
            if item.split("=", 1)[0] in _OWNED:
                raise ValueError(f"extra: {item!r} is set by alignflow itself ({_OWNED[item.split('=', 1)[0]]})")
        return value

    def time_limit_minutes(self, step_timeout_s: float | None) -> int | None:
        """The job's `--time` in minutes: the shorter of this cap and the step's own limit (None: neither)."""
        limits = [slurm_minutes(self.time_limit)] if self.time_limit else []
        if step_timeout_s is not None:
            limits.append(max(1, -(-int(step_timeout_s) // 60)))
        return min(limits) if limits else None


# Options whose values alignflow writes itself: the job's files must be where the transport looks for them.
_OWNED = {
    "--output": "the job's stdout file", "-o": "the job's stdout file",
    "--error": "the job's stderr file", "-e": "the job's stderr file",
    "--chdir": "the job's directory", "-D": "the job's directory",
    "--job-name": "the step's name", "-J": "the step's name",
    "--parsable": "how the job id is read",
}
