"""`ssh_config: true` on a host: take what hosts.yaml leaves out from the user's OpenSSH client config.

By default alignflow never reads `~/.ssh/config` (hosts.yaml alone decides how a host is reached; the generated
OpenSSH config is passed with `-F`). A user whose cluster is already described there - a bastion, a non-standard
port, a per-cluster key - opts in per host, and these keywords are taken from the entry that matches the host's
`address` (paramiko's reader applies `Host`/`Match` blocks as ssh does):

    HostName -> address, Port -> port, User -> user, IdentityFile -> identity_file (the first), ProxyJump ->
    proxy_jump (one hop)

A value written in hosts.yaml always wins. Host-key settings (`StrictHostKeyChecking`, `UserKnownHostsFile`) are
never taken: keys are checked against alignflow's managed known_hosts with the reject policy, whatever the user's
config says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import paramiko

from alignflow.config.jump import parse_jump
from alignflow.errors import ConfigError


def default_ssh_config_path() -> Path:
    return Path("~/.ssh/config").expanduser()


def ssh_config_fields(alias: str, path: Path | None = None) -> dict[str, Any]:
    """The hosts.yaml fields that `path` (default ~/.ssh/config) gives for `alias`; {} if there is no such file."""
    path = path or default_ssh_config_path()
    if not path.is_file():
        return {}
    try:
        config = paramiko.SSHConfig.from_path(str(path))
        entry = config.lookup(alias)
    except (OSError, paramiko.SSHException, ValueError, KeyError) as exc:
        raise ConfigError([(str(path), None, f"cannot read it: {exc}")]) from None
    fields: dict[str, Any] = {}
    if entry.get("hostname") and entry["hostname"] != alias:
        fields["address"] = entry["hostname"]
    if entry.get("port"):
        fields["port"] = int(entry["port"])
    if entry.get("user"):
        fields["user"] = entry["user"]
    if entry.get("identityfile"):
        fields["identity_file"] = entry["identityfile"][0]
    jump = entry.get("proxyjump")
    if jump and jump.lower() != "none":
        try:
            fields["proxy_jump"] = parse_jump(jump)
        except ValueError as exc:
            raise ConfigError([(str(path), None, f"Host {alias}: {exc}")]) from None
    return fields
