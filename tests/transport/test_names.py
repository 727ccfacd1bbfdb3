"""`unresolved`: the names of a run's SSH hosts that the resolver says do not exist, looked up before anything starts
(issue 45); a resolver that does not answer, or answers late, refuses nothing. The resolver here is a fake."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from alignflow.config.hosts import Host
from alignflow.errors import HostNotFound
from alignflow.transport.names import unresolved


def _ssh(name: str, address: str, **fields: Any) -> Host:
    return Host(name=name, role="ascend", transport="ssh", address=address, user="alice", workdir="/data/af", **fields)


class Resolver:
    """getaddrinfo's stand-in: the names it knows, the errno it answers for the others, the names it was asked."""

    def __init__(self, known: set[str], errno: int = socket.EAI_NONAME, hang: threading.Event | None = None) -> None:
        self.known, self.errno, self.hang, self.asked = known, errno, hang, list[str]()

    def __call__(self, address: str, port: object, **kwargs: object) -> list[object]:
        self.asked.append(address)
        if self.hang is not None:
            self.hang.wait()
        if address in self.known:
            return [object()]
        raise socket.gaierror(self.errno, "Name or service not known")


def test_a_name_the_resolver_does_not_know_is_found_naming_its_host_and_key() -> None:
    resolver = Resolver({"gpu-a.example.org"})
    found = unresolved([_ssh("npu-a", "npu-a.exmaple.org"), _ssh("gpu-a", "gpu-a.example.org")], lookup=resolver)
    assert [(u.key, type(u.error)) for u in found] == [(("hosts", "npu-a", "address"), HostNotFound)]
    assert str(found[0].error).startswith("npu-a: cannot resolve 'npu-a.exmaple.org': Name or service not known")
    assert "(check: npu-a reachable)" in str(found[0].error)
    assert sorted(resolver.asked) == ["gpu-a.example.org", "npu-a.exmaple.org"]


def test_a_dot_invalid_name_is_found_without_asking_and_local_hosts_are_not_looked_at() -> None:
    resolver = Resolver(set())
    local = Host(name="cpu", role="cpu", transport="local", workdir="/tmp/af")
    found = unresolved([_ssh("npu-a", "npu-nonexistent.invalid."), local], lookup=resolver)
    assert [u.key for u in found] == [("hosts", "npu-a", "address")]
    assert "a `.invalid` name never resolves (RFC 6761)" in str(found[0].error)
    assert resolver.asked == []


def test_a_resolver_that_does_not_answer_refuses_nothing() -> None:
    assert unresolved([_ssh("npu-a", "npu-a.example.org")], lookup=Resolver(set(), errno=socket.EAI_AGAIN)) == []


def test_a_resolver_that_answers_late_is_left_to_the_run_after_the_timeout() -> None:
    hang = threading.Event()
    started = time.monotonic()
    try:
        found = unresolved([_ssh("npu-a", "npu-a.example.org"), _ssh("gpu-a", "gpu-a.example.org")],
                           timeout_s=0.2, lookup=Resolver(set(), hang=hang))
    finally:
        hang.set()
    assert found == []
    assert time.monotonic() - started < 2  # both names at once, within one timeout


@pytest.mark.parametrize(("jump", "key"), [
    ({"address": "bastion.example.org"}, ("hosts", "npu-a", "proxy_jump")),
    ({"name": "bastion", "address": "bastion.example.org"}, ("hosts", "bastion", "address")),
])
def test_behind_a_jump_host_only_the_jump_host_s_name_is_looked_up_here(jump: dict[str, str],
                                                                       key: tuple[str, ...]) -> None:
    resolver = Resolver(set())
    found = unresolved([_ssh("npu-a", "npu-a.internal", proxy_jump=jump)], lookup=resolver)
    assert resolver.asked == ["bastion.example.org"]  # npu-a.internal is the jump host's to resolve
    assert [u.key for u in found] == [key]
