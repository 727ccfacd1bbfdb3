"""Fetching the keys a host presents (no authentication), for `alignflow hosts trust` to show and a person to accept.

Over a jump host (proxy_jump) the handshake runs through a channel of the jump's own, already trusted, connection.
"""

from __future__ import annotations

import paramiko

from alignflow.config.hosts import Host
from alignflow.errors import HostUnreachable
from alignflow.transport.hostkeys import HostKey
from alignflow.transport.ssh import SSHShell, jump_channel, open_socket

# One handshake per type: a server presents one key per connection, chosen from the types we offer.
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512")


def fetch_host_keys(host: Host) -> list[HostKey]:
    """The keys the host presents (no authentication happens); `HostUnreachable` if it does not answer."""
    if host.transport != "ssh":
        raise ValueError(f"host {host.name!r} uses the {host.transport} transport: it has no host key to trust")
    found: dict[str, HostKey] = {}
    errors = []
    jump = host.jump_host()
    via = SSHShell(jump) if jump is not None else None  # the jump's own key must be trusted already
    for key_type in KEY_TYPES:
        sock = jump_channel(via.connect(), host, jump.name) if via is not None and jump is not None \
            else open_socket(host)
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
    if via is not None:
        via.close()
    if not found:
        raise HostUnreachable(f"no host key obtained from {host.address}:{host.port} ({'; '.join(errors)})",
                              host=host.name)
    return list(found.values())
