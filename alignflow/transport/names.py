"""Whether an SSH host's name resolves: the one reading of the resolver's answer, for a connect and for a run's
first check.

The resolver answers three ways, and each means something different for a run:
- an address: go on;
- no such name (`EAI_NONAME` and kin, or a `.invalid` name, which never resolves: RFC 6761): `HostNotFound`, a
  permanent error - a typo or a renamed host in the inventory, which retrying cannot change (issue 45);
- no answer (`EAI_AGAIN`: a DNS server down for a moment): `HostUnreachable`, retried by the step that connects.

`unresolved` is what `alignflow run` asks before anything starts (flows/cli.py): every SSH host its steps use,
looked up at once, each lookup a thread so that a resolver that does not answer costs at most `timeout_s`, and is
then left to the run. A host behind a jump host has its name resolved there, not here: only its jump host's name is
looked up (and its own checked for `.invalid`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from alignflow.config.hosts import Host
from alignflow.errors import HostNotFound, HostUnreachable

# getaddrinfo's answers that a name does not exist (as opposed to EAI_AGAIN: the resolver did not answer)
NO_SUCH_NAME = frozenset(getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY")
                         if hasattr(socket, name))
LOOKUP_S = 3.0  # how long `unresolved` waits for a resolver before it leaves the name to the run

Lookup = Callable[..., Any]  # socket.getaddrinfo's signature


def never_resolves(address: str) -> bool:
    """A `.invalid` name (RFC 6761): no resolver anywhere has it, so none is asked."""
    return address.rstrip(".").lower().endswith(".invalid")


def invalid_name(address: str, *, host: str) -> HostNotFound:
    return HostNotFound(f"cannot resolve {address!r}: a `.invalid` name never resolves (RFC 6761); set its "
                        "`address:` in the inventory", host=host)


def lookup_error(exc: socket.gaierror, address: str, *, host: str) -> HostNotFound | HostUnreachable:
    """`exc` of looking `address` up as alignflow's error: no such name is permanent, anything else is retried."""
    if exc.errno in NO_SUCH_NAME:  # the resolver answered: no such name (a typo, a renamed host)
        return HostNotFound(f"cannot resolve {address!r}: {exc.strerror}; check its `address:` in the inventory",
                            host=host)
    return HostUnreachable(f"cannot resolve {address!r}: {exc.strerror}", host=host)


@dataclass(frozen=True, slots=True)
class Unresolved:
    """A name that does not resolve: the inventory key that holds it (`hosts.NAME.address`, or the `proxy_jump` of
    a host behind a jump host) and the error its connect would raise."""

    key: tuple[str, ...]
    error: HostNotFound


def _names(host: Host) -> list[tuple[tuple[str, ...], str, str, bool]]:
    """(its key, the host named in an error, the address, whether it is looked up here) for each name `host` needs."""
    if host.transport != "ssh" or host.address is None:
        return []
    own = ("hosts", host.name, "address")
    jump = host.jump_host()
    if jump is None:
        return [(own, host.name, host.address, True)]
    assert jump.address is not None
    via = ("hosts", jump.name, "address") if host.proxy_jump and host.proxy_jump.name else \
        ("hosts", host.name, "proxy_jump")
    return [(own, host.name, host.address, False), (via, jump.name, jump.address, True)]


def unresolved(hosts: Iterable[Host], *, timeout_s: float = LOOKUP_S,
               lookup: Lookup = socket.getaddrinfo) -> list[Unresolved]:
    """The names among `hosts` (SSH ones; their jump hosts) that the resolver says do not exist, each once, in the
    order given; a name whose lookup has not answered within `timeout_s`, or failed otherwise, is not among them."""
    names: dict[str, tuple[tuple[str, ...], str]] = {}  # address -> (its key, the host named), in the order given
    asked: set[str] = set()
    for host in hosts:
        for key, name, address, here in _names(host):
            names.setdefault(address, (key, name))
            if here and not never_resolves(address):
                asked.add(address)
    answers: dict[str, HostNotFound | HostUnreachable | None] = {}

    def ask(address: str) -> None:
        try:
            lookup(address, None, type=socket.SOCK_STREAM)
            answers[address] = None
        except socket.gaierror as exc:
            answers[address] = lookup_error(exc, address, host=names[address][1])
        except (OSError, UnicodeError):  # an address getaddrinfo cannot even encode: the connect says why
            answers[address] = None

    # daemon threads: a resolver that never answers must not hold the command's exit (a pool's workers would)
    threads = [threading.Thread(target=ask, args=(a,), name=f"resolve {a}", daemon=True) for a in names if a in asked]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    found: list[Unresolved] = []
    for address, (key, name) in names.items():
        err = invalid_name(address, host=name) if never_resolves(address) else answers.get(address)
        if isinstance(err, HostNotFound):
            found.append(Unresolved(key, err))
    return found
