"""What retrying cannot change is told apart from what it can (issue 45, item 2): a name that does not resolve, a
host key, a refused key and a workdir that cannot be made are `HostUnusable` (not retried, exit 2, naming the host
and the `doctor` check); a resolver that did not answer and a dropped connection stay retryable."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from alignflow.config.hosts import Host
from alignflow.errors import (
    AuthenticationFailed,
    HostKeyRejected,
    HostNotFound,
    HostUnreachable,
    HostUnusable,
    TransportError,
    WorkdirUnusable,
)
from alignflow.transport.openssh import OpenSSHClient
from alignflow.transport.routes import openssh_error
from alignflow.transport.ssh import open_socket


def _host(address: str) -> Host:
    return Host(name="npu-a", role="ascend", transport="ssh", address=address, user="alice", workdir="/data/af")


def test_a_dot_invalid_address_is_not_found_at_once_without_asking_a_resolver() -> None:
    started = time.monotonic()
    with pytest.raises(HostNotFound) as info:
        open_socket(_host("npu-nonexistent.invalid"))
    assert time.monotonic() - started < 1
    assert not info.value.retryable
    assert info.value.exit_code == 2
    assert str(info.value).startswith("npu-a: cannot resolve 'npu-nonexistent.invalid'")
    assert "`alignflow doctor --hosts <inventory>` shows it (check: npu-a reachable)" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("errno", "kind", "retryable"), [
    (socket.EAI_NONAME, HostNotFound, False),  # the resolver answered: no such name
    (socket.EAI_AGAIN, HostUnreachable, True),  # the resolver did not answer: it may next time
])
def test_a_name_that_does_not_resolve_is_permanent_a_resolver_that_does_not_answer_is_not(
        monkeypatch: pytest.MonkeyPatch, errno: int, kind: type[TransportError], retryable: bool) -> None:
    def refuse(*args: object, **kwargs: object) -> socket.socket:
        raise socket.gaierror(errno, "resolver says no")

    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(kind) as info:
        open_socket(_host("npu-a.example.org"))
    assert info.value.retryable is retryable


@pytest.mark.parametrize(("stderr", "kind"), [
    ("ssh: Could not resolve hostname gpu-b.lab: Name or service not known\r\n", HostNotFound),
    ("ssh: Could not resolve hostname x.invalid: Temporary failure in name resolution\r\n", HostNotFound),
    ("Host key verification failed.\r\n", HostKeyRejected),
    ("alice@10.0.0.2: Permission denied (publickey).\r\n", AuthenticationFailed),
    ("ssh: Could not resolve hostname gpu-b.lab: Temporary failure in name resolution\r\n", TransportError),
    ("client_loop: send disconnect: Broken pipe\r\n", TransportError),
])
def test_openssh_s_own_words_decide_whether_a_transfer_is_retried(stderr: str, kind: type[TransportError]) -> None:
    error = openssh_error("transfer failed (exit 255, rsync)", stderr, host="gpu-b")
    assert type(error) is kind
    assert error.retryable is (kind is TransportError)
    assert str(error).startswith("gpu-b: transfer failed")


def test_each_permanent_error_names_the_doctor_check_that_shows_it() -> None:
    assert WorkdirUnusable("cannot create or enter workdir '/data'", host="h").check == "workdir"
    for kind in (HostNotFound, HostKeyRejected, AuthenticationFailed, WorkdirUnusable):
        error = kind("what happened", host="h")
        assert isinstance(error, HostUnusable)
        assert (error.retryable, error.exit_code) == (False, 2)
        assert f"(check: h {error.check})" in str(error)
        assert error.cause.startswith("h: what happened")


@pytest.mark.integration
def test_the_openssh_client_to_an_unresolvable_host_is_a_permanent_error() -> None:
    """The real `ssh` (what rsync copies through): no network is needed to be told a `.invalid` name is unknown."""
    client = OpenSSHClient(_host("npu-nonexistent.invalid"))
    try:
        done = subprocess.run(client.ssh_argv("true"), capture_output=True, text=True, timeout=60, check=False)
    finally:
        client.close()
    assert done.returncode == 255
    error = openssh_error("transfer failed (exit 255, ssh)", done.stderr, host="npu-a")
    assert isinstance(error, HostNotFound), done.stderr


@pytest.mark.integration
def test_a_run_against_an_unresolvable_host_ends_error_in_seconds(tmp_path: Path, repo_root: Path) -> None:
    """The issue's case: hosts.ssh.example.yaml's host at `npu-nonexistent.invalid`, through the real SSH transport
    (its three retries took ~10 min, silently)."""
    import yaml

    from alignflow.runner.run import execute_pipeline, start_run
    from alignflow.store import Store
    from alignflow.transport import open_transport
    from tests.flows.conftest import make_flow_env

    env = make_flow_env(tmp_path, repo_root)
    hosts = yaml.safe_load(env.hosts.read_text())
    hosts["hosts"]["ascend"] = {"role": "ascend", "transport": "ssh", "address": "npu-nonexistent.invalid",
                                "user": "alice", "workdir": "/data/alignflow", "connect_timeout_s": 10}
    env.hosts.write_text(yaml.safe_dump(hosts))
    messages: list[str] = []
    with Store.open(state_dir=env.state, upgrade=True) as store:
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)
        started = time.monotonic()
        view = execute_pipeline(run_id, store=store, state_dir=env.state, transport_factory=open_transport,
                                events=messages.append)
        took = time.monotonic() - started
    assert took < 15, took
    assert (view.status, view.exit_code) == ("error", 2)
    assert view.error is not None
    assert view.error.startswith("ascend: cannot resolve 'npu-nonexistent.invalid'")
    assert "(check: ascend reachable)" in view.error  # the permanent kind: not retried by the flow's step task
    assert "\n" not in view.error
    assert not [m for m in messages if "retrying" in m]
    step = view.step("npu_base_train")  # it failed reaching its host, before its executor recorded it
    assert step is not None
    assert (step.status, step.error) == ("failed", view.error)
