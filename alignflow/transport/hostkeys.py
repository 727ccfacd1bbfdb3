"""Trusting a host: fetch the keys it presents, show their fingerprints, write them to its known_hosts.

This is the only way a key enters a managed known_hosts file: transports never add keys (reject policy),
so a new or changed key stops everything until a person has looked at the fingerprint (`alignflow hosts
trust NAME`), compared it with the one the host's administrator sees (`ssh-keygen -lf
/etc/ssh/ssh_host_ed25519_key.pub`), and accepted it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import paramiko

from alignflow.config.hosts import Host
from alignflow.errors import HostUnreachable, TransportError
from alignflow.transport.openssh import known_host_name, known_hosts_path
from alignflow.transport.ssh import key_fingerprint, open_socket

# One handshake per type: a server presents one key per connection, chosen from the types we offer.
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512")


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


def fetch_host_keys(host: Host) -> list[HostKey]:
    """The keys the host presents (no authentication happens); `HostUnreachable` if it does not answer."""
    if host.transport != "ssh":
        raise ValueError(f"host {host.name!r} uses the {host.transport} transport: it has no host key to trust")
    found: dict[str, HostKey] = {}
    errors = []
    for key_type in KEY_TYPES:
        sock = open_socket(host)
        tr = paramiko.Transport(sock)
        try:
            tr.get_security_options().key_types = [key_type]
            tr.banner_timeout = host.connect_timeout_s
            tr.start_client(timeout=host.connect_timeout_s)
            key = HostKey.of(tr.get_remote_server_key())
            found.setdefault(key.kind, key)
        except (paramiko.SSHException, EOFError, OSError) as exc:  # this key type is not offered, or no SSH
            errors.append(f"{key_type}: {exc}")
        finally:
            tr.close()
    if not found:
        raise HostUnreachable(f"no host key obtained from {host.address}:{host.port} ({'; '.join(errors)})",
                              host=host.name)
    return list(found.values())


def trusted_keys(host: Host) -> list[HostKey]:
    """The keys the host's known_hosts file holds for it now (hashed entries included)."""
    path = known_hosts_path(host)
    if not path.exists():
        return []
    try:
        keys = paramiko.HostKeys(str(path)).lookup(known_host_name(host))
    except (OSError, paramiko.SSHException) as exc:
        raise TransportError(f"cannot read {path}: {exc}", host=host.name) from None
    return [HostKey.of(keys[k]) for k in keys] if keys else []


def _entry_matches(line: str, name: str) -> bool:
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
