"""The host inventory (`hosts.yaml`): which machines exist, their role, and how to reach them.

Other tools and scripts write this file, so its shape is part of alignflow's interface:

```yaml
hosts:
  npu-a:
    role: ascend
    transport: ssh
    address: 192.0.2.10
    user: alice
    identity_file: ~/.ssh/id_ed25519
    known_hosts: ~/.config/alignflow/known_hosts
    workdir: /data/alignflow
    python: /opt/venvs/mindformers/bin/python
    setup: ["source /usr/local/Ascend/ascend-toolkit/set_env.sh"]
    env: {HCCL_DETERMINISTIC: "true"}
    repos: {mindformers: /data/src/mindformers}
  gpu-a:
    role: cuda
    transport: ssh
    address: 192.0.2.20
    user: alice
    workdir: /data/alignflow
    python: /opt/venvs/megatron/bin/python
    cuda_extensions: [transformer_engine, apex]
  cpu-a: {role: cpu, transport: local, workdir: ~/.alignflow/hosts/cpu-a}
  cpu-b: {role: cpu, transport: local, workdir: hosts/cpu-b}    # relative: under the state dir
```

A relative workdir of a *local* host lives under alignflow's state dir (`$ALIGNFLOW_STATE_DIR`, default
`./.alignflow`), next to the store and the reports, so that one directory holds everything a run writes on this
machine (the committed `hosts.yaml` uses `hosts/<name>`). Remote workdirs are the remote host's business and stay
as written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from alignflow.config.jump import JumpHost, parse_jump
from alignflow.config.slurm import SlurmConfig
from alignflow.config.yamlsource import load_yaml, validate
from alignflow.errors import ConfigError, did_you_mean

Role = Literal["ascend", "cpu", "cuda", "controller"]
ROLES: tuple[Role, ...] = ("ascend", "cpu", "cuda", "controller")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Environment names are shell identifiers: they are written into `export NAME=...` lines on hosts.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# C0 controls and DEL: a workdir holding a newline is read back as two lines by any tool that prints it (issue 16).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _env_name(key: str) -> str:
    if not ENV_NAME.match(key):
        raise ValueError(f"{key!r} is not a valid environment variable name (letters, digits and _, not starting "
                         "with a digit)")
    return key


EnvName = Annotated[str, AfterValidator(_env_name)]
"""A key of an `env:` mapping; as a dict key type, an invalid name is reported at its own line."""


def no_control_characters(value: str | None) -> str | None:
    """Refuse a path or name holding a control character (newline, tab, escape, ...), saying which one."""
    if value is not None and (bad := _CONTROL.search(value)):
        raise ValueError(f"{value!r} contains the control character {bad.group()!r}; paths and names must not")
    return value
_SECRET_KEYS = {"password", "passphrase", "pass", "secret"}
CudaExtension = Literal["transformer_engine", "apex"]


class Host(BaseModel):
    """One machine of the inventory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("", description="Host name: the key under `hosts:` (filled in by the loader).")
    role: Role = Field(description="What the host does in the pipeline: ascend (NPU training), cpu (conversion), "
                       "cuda (GPU training) or controller.")
    transport: Literal["local", "ssh"] = Field("local", description="How commands reach the host.")
    address: str | None = Field(None, description="SSH address (name or IP); ssh only.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str | None = Field(None, description="SSH user; ssh only.")
    identity_file: str | None = Field(
        None, description="Private key for SSH; without it the SSH agent is used. Passwords are never accepted."
    )
    known_hosts: str | None = Field(
        None,
        description="known_hosts file checked with a reject policy (unknown or changed keys are refused); "
        "default ~/.config/alignflow/known_hosts.",
    )
    workdir: str = Field(description="Directory on the host under which every alignflow path lives (jobs, artifacts).")
    python: str | None = Field(
        None, description="Python interpreter on the host with alignflow installed; default: the controller's own "
        "interpreter for local hosts, `python3` for ssh hosts."
    )
    setup: list[str] = Field(
        default_factory=list, description="Shell lines run before every command on the host (e.g. CANN's set_env.sh)."
    )
    env: dict[EnvName, str] = Field(default_factory=dict, description="Environment variables set for every command.")
    max_concurrent_jobs: int = Field(1, ge=1, description="Detached jobs this host runs at once.")
    repos: dict[str, str] = Field(
        default_factory=dict, description="Framework checkouts (name -> path) whose git commit and dirty state are "
        "recorded in every host snapshot."
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="Seconds to wait for an SSH connection.")
    cuda_extensions: list[CudaExtension] = Field(
        default_factory=list, description="What a cuda host's Python has besides PyTorch: transformer_engine, apex. "
        "Megatron's fused kernels are switched on only where their extension is declared here (a declared one "
        "that is missing is a preflight error); without any, the local implementation runs unfused."
    )
    scheduler: Literal["direct", "slurm"] = Field(
        "direct", description="How jobs start: direct (a detached process on the host itself) or slurm (an sbatch "
        "job submitted from the host, a login node; see `slurm`).")
    slurm: SlurmConfig | None = Field(None, description="What the host's Slurm jobs ask for (scheduler: slurm).")
    devices: int | None = Field(
        None, ge=1, description="Accelerators (GPUs or NPUs) per node that one training uses: torchrun's "
        "--nproc-per-node, msrun's local_worker_num. Default: slurm.gpus_per_node on a Slurm host, else 1.")
    proxy_jump: JumpHost | None = Field(
        None, description="Reach this SSH host through a jump host (OpenSSH ProxyJump): another ssh host of this "
        "inventory by name, [user@]address[:port], or its fields. Used by commands and bulk copies alike; both "
        "hops' host keys are checked.")
    ssh_config: bool = Field(
        False, description="Also read ~/.ssh/config for this host (HostName, Port, User, IdentityFile, "
        "ProxyJump), for what this file leaves out. Host keys still come only from `known_hosts`.")

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if str(key).lower() in _SECRET_KEYS:
                    raise ValueError(
                        f"'{key}': passwords are not accepted in any file; use identity_file or an SSH agent"
                    )
        return data

    _plain = field_validator("workdir", "address", "user", "identity_file", "known_hosts", "python")(
        no_control_characters)

    @field_validator("proxy_jump", mode="before")
    @classmethod
    def _jump_spec(cls, value: Any) -> Any:
        return parse_jump(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _ssh_fields(self) -> Host:
        if self.transport == "ssh":
            needed = ("address",) if self.ssh_config else ("address", "user")  # ssh_config may supply the user
            missing = [k for k in needed if getattr(self, k) in (None, "")]
            if missing:
                raise ValueError(f"transport ssh needs {' and '.join(missing)}")
        elif self.proxy_jump is not None or self.ssh_config:
            raise ValueError("proxy_jump and ssh_config apply to transport ssh only")
        return self

    @model_validator(mode="before")
    @classmethod
    def _slurm_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("scheduler") == "slurm" and data.get("slurm") is None:
            data = {**data, "slurm": {}}  # a Slurm host without a slurm: section asks for the cluster's defaults
        return data

    @model_validator(mode="after")
    def _scheduler_fields(self) -> Host:
        if self.scheduler == "direct" and self.slurm is not None:
            raise ValueError("slurm: given, but scheduler is direct; set scheduler: slurm to submit jobs to Slurm")
        return self

    def jump_host(self) -> Host | None:
        """The jump host as a host of its own (its name: the inventory's, else `<name>-jump`), for the transports."""
        j = self.proxy_jump
        if j is None:
            return None
        return Host(name=j.name or f"{self.name}-jump", role="controller", transport="ssh", address=j.address,
                    port=j.port, user=j.user or self.user, identity_file=j.identity_file or self.identity_file,
                    known_hosts=j.known_hosts or self.known_hosts, workdir="/",
                    connect_timeout_s=j.connect_timeout_s or self.connect_timeout_s)

    @property
    def nodes(self) -> int:
        """Nodes of one training job: the Slurm allocation's, else this one machine."""
        return self.slurm.nodes if self.scheduler == "slurm" and self.slurm is not None else 1

    @property
    def devices_per_node(self) -> int:
        """Processes per node of a multi-process training (see `devices`)."""
        if self.devices is not None:
            return self.devices
        if self.slurm is not None and self.slurm.gpus_per_node:
            return self.slurm.gpus_per_node
        return 1

    @property
    def is_local(self) -> bool:
        return self.transport == "local"


class Inventory(BaseModel):
    """The whole `hosts.yaml`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: dict[str, Host] = Field(description="Hosts by name.")
    source: str | None = Field(None, exclude=True, description="File the inventory was read from.")

    @model_validator(mode="before")
    @classmethod
    def _fill_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("hosts"), dict):
            hosts = {}
            for name, body in data["hosts"].items():
                if not isinstance(name, str) or not _NAME.match(name):
                    raise ValueError(f"hosts: {name!r} is not a valid host name (letters, digits, '.', '_', '-')")
                if isinstance(body, dict):
                    body = {**body, "name": name}
                hosts[name] = body
            data = {**data, "hosts": _resolve_jump_names(hosts)}
        return data

    @model_validator(mode="after")
    def _not_empty(self) -> Inventory:
        if not self.hosts:
            raise ValueError("hosts: at least one host is required")
        return self

    def get(self, name: str) -> Host:
        """The host called `name`; the error lists the names that exist."""
        try:
            return self.hosts[name]
        except KeyError:
            where = self.source or "hosts.yaml"
            raise ConfigError(f"unknown host '{name}'{did_you_mean(name, self.hosts)}; {where} defines: "
                              f"{', '.join(sorted(self.hosts))}") from None

    def by_role(self, role: Role) -> list[Host]:
        return [h for h in self.hosts.values() if h.role == role]


def _resolve_jump_names(hosts: dict[str, Any]) -> dict[str, Any]:
    """`proxy_jump: <name of another host>` becomes that host's address, port, user, identity and known_hosts."""
    out = dict(hosts)
    for name, body in hosts.items():
        jump = body.get("proxy_jump") if isinstance(body, dict) else None
        if not isinstance(jump, str) or jump not in hosts:
            continue
        target = hosts[jump]
        if jump == name or not isinstance(target, dict) or target.get("transport") != "ssh":
            raise ValueError(f"hosts.{name}.proxy_jump: {jump!r} must be another host with transport ssh")
        if target.get("proxy_jump") is not None:
            raise ValueError(f"hosts.{name}.proxy_jump: {jump!r} has a proxy_jump itself (one hop only)")
        fields = {k: target[k] for k in ("address", "port", "user", "identity_file", "known_hosts",
                                         "connect_timeout_s") if target.get(k) is not None}
        fields["name"] = jump
        out[name] = {**body, "proxy_jump": fields}
    return out


def load_hosts(path: str | Path, *, state_dir: Path | None = None) -> Inventory:
    """Load and validate a hosts file; errors name the file, the line and the key.

    Relative workdirs of local hosts are resolved under `state_dir` (default: `alignflow.state.state_dir()`).
    """
    doc = load_yaml(path)
    inventory = validate(Inventory, doc)
    if state_dir is None:
        from alignflow.state import state_dir as default_state_dir

        state_dir = default_state_dir()
    resolved = {name: _with_ssh_config(_resolve_relative_workdir(h, state_dir), path)
                for name, h in inventory.hosts.items()}
    return Inventory(hosts=resolved, source=str(path))


def _with_ssh_config(host: Host, source: str | Path) -> Host:
    """A host with `ssh_config: true` completed from ~/.ssh/config (see `alignflow.config.sshconfig`)."""
    if not host.ssh_config:
        return host
    from alignflow.config.sshconfig import ssh_config_fields

    assert host.address is not None
    # `address` is the alias looked up: its HostName replaces it; any other field written here wins
    found = {k: v for k, v in ssh_config_fields(host.address).items()
             if k == "address" or k not in host.model_fields_set}
    jump = found.get("proxy_jump")
    if isinstance(jump, dict):  # the jump may be an alias of the user's config too: its HostName, Port, User, key
        alias = ssh_config_fields(jump["address"])
        found["proxy_jump"] = {**{k: alias[k] for k in ("port", "user", "identity_file") if k in alias}, **jump,
                               **({"address": alias["address"]} if "address" in alias else {})}
    updated = Host.model_validate({**host.model_dump(exclude_unset=True), **found, "name": host.name})
    if updated.user is None:
        raise ConfigError([(str(source), None, f"hosts.{host.name}: no user, neither in this file nor for "
                            f"{host.address} in ~/.ssh/config")])
    return updated


def _resolve_relative_workdir(host: Host, base: Path) -> Host:
    if host.is_local and not host.workdir.startswith(("/", "~")):
        return host.model_copy(update={"workdir": str((base / host.workdir).resolve())})
    return host
