"""Trusting a host: the keys its known_hosts holds, their fingerprints, writing the ones a person accepted.

This is the only way a key enters a managed known_hosts file: transports never add keys (reject policy),
so a new or changed key stops everything until a person has looked at the fingerprint (`alignflow hosts
trust NAME`; `keyscan.fetch_host_keys` fetches the presented keys), compared it with the one the host's
administrator sees (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`), and accepted it.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from alignflow.config.hosts import Host
from alignflow.errors import TransportError
from alignflow.transport.openssh import known_host_name, known_hosts_path

if TYPE_CHECKING:  # Paramiko is imported where a key is read: a run on local hosts never reads one (issue 40)
    import paramiko


def key_fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's `SHA256:...` form, what `ssh-keygen -lf` and ssh's prompts show."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class HostKey:
    """A public host key as known_hosts stores it."""

    kind: str
    base64: str
    fingerprint: str

    @classmethod
    def of(cls, key: paramiko.PKey) -> HostKey:
        return cls(key.get_name(), key.get_base64(), key_fingerprint(key))

    def known_hosts_line(self, name: str) -> str:
        return f"{name} {self.kind} {self.base64}"


def trusted_keys(host: Host) -> list[HostKey]:
    """The keys the host's known_hosts file holds for it now (hashed entries included)."""
    path = known_hosts_path(host)
    if not path.exists():
        return []
    import paramiko

    try:
        keys = paramiko.HostKeys(str(path)).lookup(known_host_name(host))
    except (OSError, paramiko.SSHException) as exc:
        raise TransportError(f"cannot read {path}: {exc}", host=host.name) from None
    return [HostKey.of(keys[k]) for k in keys] if keys else []


def _entry_matches(line: str, name: str) -> bool:
    import paramiko

    entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
    if entry is None:
        return False
    for pattern in entry.hostnames:
        if pattern.startswith("|1|"):
            salt = pattern.split("|")[2]
            if paramiko.HostKeys.hash_host(name, salt) == pattern:
                return True
        elif pattern == name:
            return True
    return False


def trust(host: Host, keys: list[HostKey]) -> Path:
    """Replace the host's entries in its known_hosts file with `keys` (other hosts' lines are kept as they are).

    Written to a temporary file and renamed, mode 600, directory 700 - a crash never leaves half a file.
    """
    path = known_hosts_path(host)
    name = known_host_name(host)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    old = path.read_text().splitlines() if path.exists() else []
    kept = [line for line in old if not (line.strip() and not line.lstrip().startswith("#")
                                         and _entry_matches(line, name))]
    lines = kept + [k.known_hosts_line(name) for k in keys]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
