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
  cpu-a: {role: cpu, transport: local, workdir: ~/.alignflow/hosts/cpu-a}
```
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alignflow.config.yamlsource import load_yaml, validate
from alignflow.errors import ConfigError

Role = Literal["ascend", "cpu", "cuda", "controller"]
ROLES: tuple[Role, ...] = ("ascend", "cpu", "cuda", "controller")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Environment names are shell identifiers: they are written into `export NAME=...` lines on hosts.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_KEYS = {"password", "passphrase", "pass", "secret"}


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
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables set for every command.")
    max_concurrent_jobs: int = Field(1, ge=1, description="Detached jobs this host runs at once.")
    repos: dict[str, str] = Field(
        default_factory=dict, description="Framework checkouts (name -> path) whose git commit and dirty state are "
        "recorded in every host snapshot."
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="Seconds to wait for an SSH connection.")

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

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_NAME.match(key):
                raise ValueError(f"env: {key!r} is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _ssh_fields(self) -> Host:
        if self.transport == "ssh":
            missing = [k for k in ("address", "user") if getattr(self, k) in (None, "")]
            if missing:
                raise ValueError(f"transport ssh needs {' and '.join(missing)}")
        return self

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
            data = {**data, "hosts": hosts}
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
            raise ConfigError(
                f"unknown host '{name}'; {where} defines: {', '.join(sorted(self.hosts))}"
            ) from None

    def by_role(self, role: Role) -> list[Host]:
        return [h for h in self.hosts.values() if h.role == role]


def load_hosts(path: str | Path) -> Inventory:
    """Load and validate a hosts file; errors name the file, the line and the key."""
    doc = load_yaml(path)
    inventory = validate(Inventory, doc)
    resolved = {name: _resolve_relative_workdir(h, Path(path).parent) for name, h in inventory.hosts.items()}
    return Inventory(hosts=resolved, source=str(path))


def _resolve_relative_workdir(host: Host, base: Path) -> Host:
    # A relative workdir of a *local* host is relative to the hosts file, so the embedded default keeps its
    # state beside the checkout. Remote workdirs are the remote host's business and stay as written.
    if host.is_local and not host.workdir.startswith(("/", "~")):
        return host.model_copy(update={"workdir": str((base / host.workdir).resolve())})
    return host
