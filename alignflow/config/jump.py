"""`proxy_jump:` of an SSH host: the bastion its connections go through (OpenSSH's ProxyJump, one hop).

```yaml
hosts:
  bastion: {role: controller, transport: ssh, address: gw.example.org, user: alice, workdir: /tmp/af}
  h200:
    role: cuda
    transport: ssh
    address: 10.0.0.7            # an address the bastion can reach
    user: alice
    proxy_jump: bastion          # another host of this file ...
    # proxy_jump: alice@gw.example.org:2222              ... or [user@]address[:port] ...
    # proxy_jump: {address: gw.example.org, user: jump}  ... or the fields themselves
```

Both hops are checked against managed known_hosts files with the reject policy: the jump's keys live in its own
`known_hosts` (default: the host's), so `alignflow hosts trust` must have accepted both. A jump given as an
address takes the host's user, identity and known_hosts unless it says otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_SPEC = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^@\s:\[\]]+))"
                   r"(?::(?P<port>\d{1,5}))?$")


class JumpHost(BaseModel):
    """The bastion of an SSH host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="The jump's own name in this inventory, when proxy_jump names a "
                             "host (filled in by the loader).")
    address: str = Field(description="Address of the jump host, as the controller reaches it.")
    port: int = Field(22, ge=1, le=65535, description="Its SSH port.")
    user: str | None = Field(None, description="User on the jump host; default: the host's user.")
    identity_file: str | None = Field(None, description="Key for the jump host; default: the host's identity_file.")
    known_hosts: str | None = Field(None, description="known_hosts holding the jump host's key; default: the "
                                    "host's known_hosts.")
    connect_timeout_s: float | None = Field(None, gt=0, description="Connect timeout; default: the host's.")


def parse_jump(spec: str) -> dict[str, Any]:
    """`[user@]address[:port]` (or `[v6addr]:port`) as JumpHost fields; ValueError naming the form otherwise."""
    if "," in spec:
        raise ValueError(f"proxy_jump {spec!r}: one jump host only (a chain of jumps is not supported)")
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ValueError(f"proxy_jump {spec!r}: expected a host name of this inventory or [user@]address[:port]")
    fields: dict[str, Any] = {"address": m.group("v6") or m.group("host")}
    if m.group("user"):
        fields["user"] = m.group("user")
    if m.group("port"):
        fields["port"] = int(m.group("port"))
    return fields
