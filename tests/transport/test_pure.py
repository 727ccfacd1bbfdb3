"""Pure parts of the transport layer: path confinement, command rendering, job values, ssh_config rendering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alignflow import fingerprint as fp_module
from alignflow.config.hosts import Host
from alignflow.errors import PathNotAllowed
from alignflow.fingerprint import Fingerprint, fingerprint
from alignflow.transport import JobHandle, JobSpec, JobState, follow_hash
from alignflow.transport.commands import render_job_script, render_prologue, wrap_command
from alignflow.transport.jobs import error_line, new_job_id
from alignflow.transport.jobs_direct import parse_status
from alignflow.transport.openssh import known_host_name, render_config
from alignflow.transport.paths import confine

WD, HOME = "/data/af", "/home/u"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("x/y", "/data/af/x/y"),
        ("/data/af/x/../y", "/data/af/y"),
        (".", "/data/af"),
        ("/data/af", "/data/af"),
        ("~/../../data/af/z", "/data/af/z"),
        ("a//b/./c", "/data/af/a/b/c"),
    ],
)
def test_paths_inside_the_workdir_are_normalized(given: str, expected: str) -> None:
    assert confine(given, workdir=WD, home=HOME, host="h") == expected


@pytest.mark.parametrize(
    "given", ["..", "../x", "x/../../y", "/data/afx", "/data", "/etc/passwd", "~", "~root/x", "", "a\0b", "//etc"]
)
def test_paths_outside_the_workdir_are_refused(given: str) -> None:
    with pytest.raises(PathNotAllowed, match="outside the host's workdir"):
        confine(given, workdir=WD, home=HOME, host="h")


@pytest.mark.integration
def test_prologue_quotes_env_values_and_orders_host_env_setup_call_env() -> None:
    text = render_prologue(host_env={"A": "1 $(x)"}, setup=["export B=$A"], env={"A": "call"}, cwd="/w d")
    out = subprocess.run(["bash", "-c", text + '\nprintf "%s|%s|%s" "$A" "$B" "$PWD"'], capture_output=True,
                         text=True, check=False, cwd="/")
    # host env is literal (no command substitution), setup sees it, the per-call env wins, cd failed -> 125
    assert out.returncode == 125
    text = render_prologue(host_env={"A": "1 $(x)"}, setup=["export B=$A"], env={"A": "call"}, cwd="/")
    out = subprocess.run(["bash", "-c", text + '\nprintf "%s|%s|%s" "$A" "$B" "$PWD"'], capture_output=True,
                         text=True, check=True)
    assert out.stdout == "call|1 $(x)|/"


def test_env_names_must_be_identifiers() -> None:
    with pytest.raises(ValueError, match="not valid environment variable"):
        render_prologue(host_env={}, setup=[], env={"A; rm -rf /": "x"}, cwd=None)


@pytest.mark.integration
def test_wrapped_command_passes_arguments_as_positional_parameters() -> None:
    argv = wrap_command(["printf", "%s\n", "a b", "$(id)", "x;y"], render_prologue(host_env={}, setup=[], env=None,
                                                                                    cwd=None))
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["a b", "$(id)", "x;y"]


@pytest.mark.integration
def test_job_script_is_runnable_and_literal() -> None:
    script = render_job_script(["printf", "%s", "it's $(x)"], "export Z=1", header="h\nmultiline")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout == "it's $(x)"


def test_job_values_round_trip_and_validate() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    handle = JobHandle(host="ascend", job_id=new_job_id("npu base/train", now), job_dir="/w/jobs/x", pid=12, pgid=12,
                       started_at=now, name="n", argv=("a", "b"))
    assert handle.job_id.startswith("npu-base-train-20260102T030405-")
    assert JobHandle.model_validate(handle.model_dump(mode="json")) == handle
    with pytest.raises(ValueError, match="argv"):
        JobSpec("python train.py")
    with pytest.raises(ValueError, match="job id"):
        JobSpec(["x"], job_id="../escape")
    assert parse_status("EXITED 3") == JobState("exited", 3)
    assert str(parse_status("EXITED 0")) == "exited(0)"
    assert parse_status("MISSING") is None
    assert parse_status("LOST") == JobState("lost")


def test_ssh_config_pins_known_hosts_and_never_reads_user_config() -> None:
    host = Host(name="h", role="cpu", transport="ssh", address="10.0.0.1", port=2222, user="u",
                identity_file="/k/id 50%", known_hosts="/k/known hosts", workdir="/w")
    text = render_config(host, control_path="/run/af/cm")
    assert "StrictHostKeyChecking yes" in text
    assert 'UserKnownHostsFile "/k/known hosts"' in text
    assert 'IdentityFile "/k/id 50%%"' in text  # '%' would start an ssh_config token
    assert "BatchMode yes" in text
    assert "PasswordAuthentication no" in text
    assert known_host_name(host) == "[10.0.0.1]:2222"
    assert known_host_name(host.model_copy(update={"port": 22})) == "10.0.0.1"


def test_both_kinds_of_host_get_a_transport_over_their_shell_and_connect_lazily() -> None:
    from alignflow.transport import LocalShell, SSHShell, Transport, open_transport

    local = open_transport(Host(name="l", role="cpu", transport="local", workdir="/nonexistent/never/created"))
    remote = open_transport(Host(name="r", role="cpu", transport="ssh", address="192.0.2.1", user="u", workdir="/w"))
    assert isinstance(local, Transport)
    assert isinstance(remote, Transport)
    assert isinstance(local.shell, LocalShell)
    assert isinstance(remote.shell, SSHShell)
    assert remote.python() == "python3"  # nothing connected, nothing created: constructors have no side effects
    remote.close()


@pytest.mark.parametrize(("stdin", "exit_code"), [(b"abort\n", 3), (b"", 0)])
def test_a_follower_stops_on_abort_and_fingerprints_the_root_at_end_of_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdin: bytes,
        exit_code: int) -> None:
    root = tmp_path / "incoming"
    root.mkdir()
    (root / "a.txt").write_text("arrived")
    r, w = os.pipe()
    os.write(w, stdin)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        assert follow_hash.main(str(root), Path(fp_module.__file__).read_text()) == exit_code
    out = capsys.readouterr().out
    if exit_code == 0:
        assert Fingerprint.from_json(json.loads(out)) == fingerprint(root)
    else:
        assert out == ""  # aborted: nothing hashed, nothing printed


def test_rsync_progress2_lines_become_progress_calls(tmp_path: Path) -> None:
    """What `rsync --info=progress2` writes: '\r'-separated updates, ',' thousands separators, then a summary."""
    from alignflow.transport.routes import _feed_progress

    stream = (
        b"              0   0%    0.00kB/s    0:00:00  \r"
        b"     32,768   0%    0.00kB/s    0:00:00  \r"
        b" 52,428,800  50%   50.00MB/s    0:00:01  \r"
        b"104,857,600 100%   48.00MB/s    0:00:02 (xfr#1, to-chk=0/1)\n"
        b"\n"
        b"sent 104,883,300 bytes  received 35 bytes  41,953,334.00 bytes/sec\n"
        b"total size is 104,857,600  speedup is 1.00\n"
    )
    (tmp_path / "out").write_bytes(stream)
    seen: list[tuple[int, int]] = []
    with open(tmp_path / "out", "rb") as fh:
        _feed_progress(fh, lambda done, total: seen.append((done, total)), 104_857_600)
    assert seen == [(0, 104_857_600), (32_768, 104_857_600), (52_428_800, 104_857_600),
                    (104_857_600, 104_857_600)]
    seen.clear()
    with open(tmp_path / "out", "rb") as fh:  # rsync may count more than the fingerprint's size: capped at total
        _feed_progress(fh, lambda done, total: seen.append((done, total)), 50_000_000)
    assert seen == [(0, 50_000_000), (32_768, 50_000_000), (50_000_000, 50_000_000), (50_000_000, 50_000_000)]
    with open(tmp_path / "out", "rb") as fh:  # no callback: the stream is still read to its end
        _feed_progress(fh, None, 104_857_600)
        assert fh.read() == b""


def test_a_mindspore_framed_error_shows_its_message_not_the_rule() -> None:
    """MindSpore's reports open with a rule after the exception type (its own layout: a rule, `- Framework Error
    Message: (For framework developers)`, a rule, the message); the step error names the message."""
    rule = "-" * 52
    framed = (f"Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nRuntimeError: {rule}\n"
              f"- Framework Error Message: (For framework developers)\n{rule}\n"
              "Out of Memory!!! Request memory size: 2892288B, Memory Statistic:\nDevice HBM memory size: 62432M\n")
    assert error_line(framed) == "RuntimeError: Out of Memory!!! Request memory size: 2892288B, Memory Statistic:"
    empty_head = f"RuntimeError: \n\n{rule}\n- Framework Error Message:\n{rule}\nInit hccl graph adapter failed.\n"
    assert error_line(empty_head) == "RuntimeError: Init hccl graph adapter failed."
    assert error_line("ValueError: bad shape\n") == "ValueError: bad shape"
    assert error_line(f"RuntimeError: {rule}\n") == f"RuntimeError: {rule}"  # nothing after the frame: as it is
