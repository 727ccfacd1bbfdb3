"""One behavioural suite, run over a LocalShell and over an SSHShell (lab host `ascend`, real sshd)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from alignflow.errors import (
    CommandTimeout,
    FingerprintMismatch,
    PathExists,
    PathMissing,
    PathNotAllowed,
    RemoteCommandError,
    RemoteJobError,
)
from alignflow.fingerprint import fingerprint
from alignflow.transport import JobSpec, JobState, Result, Transport, copy_between
from tests.transport.conftest import MakeTransport

pytestmark = pytest.mark.integration

EVIL = [
    "a b",
    "it's",
    'say "hi"',
    "x; touch PWNED1",
    "$(touch PWNED2)",
    "`touch PWNED3`",
    "line1\nline2; touch PWNED4",
    "*",
    "$HOME",
    "-n",
    "--",
    "back\\slash",
    "",
    "| touch PWNED5 &",
]
ECHO_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def _eventually(predicate: Callable[[], bool], what: str) -> None:
    """Poll `predicate` for up to ~15 s; fail saying `what` never happened."""
    for _ in range(300):
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def _pwned(t: Transport) -> list[str]:
    found = t.run(["bash", "-c", "find . -name 'PWNED*'"]).stdout.split()
    return found


# -- commands ------------------------------------------------------------------------------------------------------
def test_arguments_reach_the_command_literally_and_execute_nothing(transport: Transport) -> None:
    done = transport.run([transport.python(), "-c", ECHO_ARGV, *EVIL])
    assert json.loads(done.stdout) == EVIL
    assert done.host == transport.host.name
    assert done.argv[-len(EVIL):] == tuple(EVIL)
    assert _pwned(transport) == []


def test_env_values_and_cwd_with_metacharacters_are_literal(transport: Transport, area: str) -> None:
    odd = f"{area}/dir with 'quote' $(touch PWNED6)"
    transport.mkdir(odd)
    done = transport.run(["bash", "-c", 'printf "%s|%s" "$V" "$PWD"'], env={"V": "$(touch PWNED7); `x`"}, cwd=odd)
    value, cwd = done.stdout.split("|")
    assert value == "$(touch PWNED7); `x`"
    assert cwd == transport.path(odd)
    assert _pwned(transport) == []


def test_commands_run_in_the_workdir_by_default(transport: Transport) -> None:
    assert transport.run(["pwd", "-P"]).stdout.strip() == transport.workdir().real


def test_nonzero_exit_raises_with_exit_code_and_stderr_tail(transport: Transport) -> None:
    script = "for i in $(seq 1 40); do echo \"err line $i\" >&2; done; exit 3"
    with pytest.raises(RemoteCommandError) as info:
        transport.run(["bash", "-c", script])
    message = str(info.value)
    assert f"{transport.host.name}: `bash -c" in message
    assert "exited 3" in message
    assert "err line 40" in message
    assert "err line 21" in message
    assert "err line 20\n" not in message
    assert info.value.result.exit_code == 3
    done = transport.run(["bash", "-c", script], check=False)
    assert done.exit_code == 3
    assert not done.ok
    assert "err line 1\n" in done.stderr


def test_timeout_kills_the_command(transport: Transport, area: str) -> None:
    transport.mkdir(area)
    with pytest.raises(CommandTimeout, match="timed out"):
        transport.run(["bash", "-c", f"sleep 2.5; touch {area}/late"], timeout_s=0.5)
    transport.run(["sleep", "2.5"])  # the command would have touched the file by now
    assert not transport.exists(f"{area}/late")


def test_host_env_and_setup_lines_apply_to_every_command(make_transport: MakeTransport) -> None:
    t = make_transport(env={"HCCL_DETERMINISTIC": "true"},
                       setup=["export FROM_SETUP=\"$HCCL_DETERMINISTIC-ok\"", "cd /", "echo chatty set_env.sh"])
    done = t.run(["printenv", "FROM_SETUP"])
    assert done.stdout == "true-ok\n"  # what setup lines print goes to stderr
    assert "chatty set_env.sh" in done.stderr
    t.write_text("f.txt", "x")
    assert t.sha256(["f.txt"])["f.txt"].size == 1
    assert t.snapshot().error is None
    assert t.run(["printenv", "HCCL_DETERMINISTIC"], env={"HCCL_DETERMINISTIC": "false"}).stdout.strip() == "false"
    assert t.run(["pwd"]).stdout.strip() == t.workdir().real  # the command's cwd wins over a setup line's cd
    handle = t.launch(JobSpec(["printenv", "FROM_SETUP"], name="env"))
    assert t.wait(handle, poll_s=0.1, timeout_s=60).ok
    assert t.tail(handle).strip() == "true-ok"


def test_a_failing_setup_line_stops_the_command(make_transport: MakeTransport) -> None:
    t = make_transport(setup=["source /nonexistent/set_env.sh"])
    done = t.run(["echo", "ran"], check=False)
    assert done.exit_code == 125
    assert "setup line 1 failed: source /nonexistent/set_env.sh" in done.stderr
    assert "ran" not in done.stdout


# -- paths and small files -----------------------------------------------------------------------------------------
def test_dotdot_and_absolute_escapes_are_refused_before_anything_runs(transport: Transport) -> None:
    for bad in ("../x", "a/../../x", "/etc/passwd", "~root/.ssh"):
        with pytest.raises(PathNotAllowed, match="outside the host's workdir"):
            transport.read_text(bad)
        with pytest.raises(PathNotAllowed):
            transport.write_text(bad, "x")
    with pytest.raises(PathNotAllowed):
        transport.sha256(["../"])
    with pytest.raises(PathNotAllowed):
        transport.remove("..", recursive=True)


def test_symlink_escapes_are_refused_on_the_host(transport: Transport, area: str) -> None:
    transport.mkdir(area)
    transport.run(["ln", "-s", "/etc", f"{area}/etc-link"])
    for op in (lambda: transport.read_text(f"{area}/etc-link/hostname"),
               lambda: transport.write_text(f"{area}/etc-link/x", "x"),
               lambda: transport.sha256([f"{area}/etc-link"]),
               lambda: transport.stat(f"{area}/etc-link")):
        with pytest.raises(PathNotAllowed, match="resolves to /etc"):
            op()


def test_small_file_operations(transport: Transport, area: str) -> None:
    name = f"{area}/sub dir/it's \"odd\";$(x)\nname.txt"
    assert not transport.exists(name)
    assert transport.stat(name) is None
    path = transport.write_text(name, "héllo\n")
    assert transport.read_text(name) == "héllo\n"
    st = transport.stat(name)
    assert st is not None
    assert st.kind == "file"
    assert st.size_bytes == len("héllo\n".encode())
    assert st.mode == 0o600
    assert st.path == path
    st_dir = transport.stat(f"{area}/sub dir")
    assert st_dir is not None
    assert st_dir.kind == "dir"
    transport.write_text(name, "second")  # atomic replace
    assert transport.read_text(name) == "second"
    with pytest.raises(RemoteCommandError, match="use get"):
        transport.read_text(name, max_bytes=3)
    with pytest.raises(PathMissing):
        transport.read_text(f"{area}/missing")
    transport.remove(name)
    assert not transport.exists(name)
    transport.remove(f"{area}/missing")  # not an error
    with pytest.raises(RemoteCommandError):
        transport.remove(area)  # not empty, not recursive
    transport.remove(area, recursive=True)
    assert not transport.exists(area)
    with pytest.raises(RemoteCommandError, match="refusing to remove the workdir"):
        transport.remove(".", recursive=True)


# -- hashing -------------------------------------------------------------------------------------------------------
def test_sha256_is_computed_on_the_host_and_matches_the_controller(transport: Transport, area: str,
                                                                   tmp_path: Path) -> None:
    transport.write_text(f"{area}/ckpt/a.bin", "A" * 1000)
    transport.write_text(f"{area}/ckpt/sub/b.json", '{"b": 1}')
    local = tmp_path / "ckpt"
    (local / "sub").mkdir(parents=True)
    (local / "a.bin").write_text("A" * 1000)
    (local / "sub" / "b.json").write_text('{"b": 1}')
    got = transport.sha256([f"{area}/ckpt", f"{area}/ckpt/a.bin"])
    assert got[f"{area}/ckpt"] == fingerprint(local)
    assert got[f"{area}/ckpt/a.bin"].sha256 == fingerprint(local / "a.bin").sha256
    with pytest.raises(PathMissing, match="missing"):
        transport.sha256([f"{area}/missing"])


# -- snapshot ------------------------------------------------------------------------------------------------------
def test_snapshot_records_versions_repos_env_and_missing_tools(make_transport: MakeTransport, repo_root: Path,
                                                              tmp_path: Path) -> None:
    t = make_transport(env={"HCCL_DETERMINISTIC": "true", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                       repos={"alignflow": str(repo_root), "gone": str(tmp_path / "nope")})
    snap = t.snapshot()
    data = snap.model_dump(mode="json")
    assert json.loads(json.dumps(data)) == data  # JSON-able
    assert snap.error is None
    assert snap.python["version"].count(".") == 2
    assert snap.packages["numpy"]
    assert snap.packages["transformer-engine"] is None  # not installed here: recorded as missing, not skipped
    assert snap.env["HCCL_DETERMINISTIC"] == "true"
    assert snap.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert len(snap.repos["alignflow"]["commit"]) == 40
    assert snap.repos["alignflow"]["dirty"] in (True, False)
    assert snap.repos["gone"]["error"] == "no such directory"
    assert snap.accelerators["nvidia-smi"]["present"] is False  # no GPU driver here: missing, not an error
    assert snap.cpus is not None
    assert snap.cpus >= 1
    assert snap.load is not None  # the report's timing conditions: a loaded host times its trainings slower
    assert len(snap.load) == 3
    assert type(snap).model_validate(data) == snap
    assert "python 3." in snap.summary()


def test_snapshot_of_a_host_without_its_python_is_a_record_not_a_crash(make_transport: MakeTransport) -> None:
    snap = make_transport(python="/nonexistent/python3").snapshot()
    assert snap.error is not None
    assert "/nonexistent/python3 exited 127" in snap.error


# -- detached jobs -------------------------------------------------------------------------------------------------
def test_job_lifecycle_status_tail_exit_code(transport: Transport) -> None:
    handle = transport.launch(JobSpec(["bash", "-c", "echo out1; echo err1 >&2; sleep 0.6; echo out2; exit 4"],
                                      name="lifecycle"))
    assert transport.status(handle) == JobState("running")
    seen: list[JobState] = []
    state = transport.wait(handle, poll_s=0.1, timeout_s=60, on_poll=seen.append)
    assert state == JobState("exited", 4)
    assert not state.ok
    assert seen[0].kind == "running"
    assert seen[-1] == state
    assert transport.tail(handle) == "out1\nout2\n"
    assert transport.tail(handle, 5, stream="stderr") == "err1\n"
    files = transport.run(["ls", handle.job_dir]).stdout.split()
    assert set(files) == {"cmd.sh", "job.sh", "spec.json", "pid", "stdout", "stderr", "exit_code"}
    cmd_sh = transport.read_text(f"{handle.job_dir}/cmd.sh")
    assert "exec bash -c 'echo out1;" in cmd_sh  # the rendered command is kept, runnable by hand
    with pytest.raises(RemoteJobError, match=r"exited\(4\)") as info:
        transport.wait(handle, poll_s=0.1, timeout_s=60, check=True)
    assert "err1" in str(info.value)
    assert handle.job_dir in str(info.value)


def test_job_ids_are_never_reused(transport: Transport, area: str) -> None:
    handle = transport.launch(JobSpec(["true"], job_id=f"{area}-fixed"))
    transport.wait(handle, poll_s=0.1, timeout_s=60)
    with pytest.raises(RemoteJobError, match="already exists"):
        transport.launch(JobSpec(["false"], job_id=f"{area}-fixed"))
    assert transport.status(handle) == JobState("exited", 0)


def test_cancel_kills_the_whole_process_group(transport: Transport, area: str) -> None:
    transport.mkdir(area)
    # a child and a grandchild that would outlive a plain `kill PID`
    script = (f"(sleep 30; touch {area}/child-survived) & (bash -c 'sleep 30; touch {area}/gc-survived') & "
              "echo started; wait")
    handle = transport.launch(JobSpec(["bash", "-c", script], name="cancel-me"))
    _eventually(lambda: "started" in transport.tail(handle), "the job printed 'started'")
    pgid_members = transport.run(["bash", "-c", f"ps -e -o pgid= | awk '$1 == {handle.pgid}' | wc -l"])
    assert int(pgid_members.stdout) >= 4  # supervisor, bash, subshells/sleeps
    state = transport.cancel(handle, grace_s=2)
    assert state == JobState("cancelled")
    left = transport.run(["bash", "-c", f"ps -e -o pgid=,stat= | awk '$1 == {handle.pgid} && $2 !~ /^Z/' | wc -l"])
    assert int(left.stdout) == 0
    assert transport.status(handle) == JobState("cancelled")
    with pytest.raises(RemoteJobError, match="cancelled"):
        transport.wait(handle, poll_s=0.1, timeout_s=10, check=True)


def test_a_job_whose_processes_vanished_without_exit_code_is_lost(transport: Transport) -> None:
    handle = transport.launch(JobSpec(["sleep", "30"], name="lost"))
    transport.run(["kill", "-KILL", "--", f"-{handle.pgid}"])  # e.g. the OOM killer, or a reboot
    state = transport.wait(handle, poll_s=0.1, timeout_s=30)
    assert state == JobState("lost")


def test_a_recycled_pid_is_not_mistaken_for_the_job(transport: Transport, area: str) -> None:
    """kill -0 would say 'alive' for any process with that pid; the job dir check does not."""
    handle = transport.launch(JobSpec(["sleep", "30"], name="recycled"))
    transport.run(["kill", "-KILL", "--", f"-{handle.pgid}"])
    other = transport.launch(JobSpec(["sleep", "30"], name="unrelated"))  # alive, same user, other job dir
    transport.write_text(f"{handle.job_dir}/pid", f"{other.pid}\n")
    try:
        assert transport.status(handle) == JobState("lost")
        assert transport.status(other) == JobState("running")
    finally:
        transport.cancel(other, grace_s=1)


def test_a_restarted_controller_reattaches_by_id(make_transport: MakeTransport) -> None:
    first = make_transport()
    handle = first.launch(JobSpec(["bash", "-c", "sleep 0.5; echo done"], name="reattach", env={"K": "v"}))
    saved = handle.model_dump(mode="json")
    first.close()
    second = make_transport()
    again = second.attach(saved["job_id"])
    assert again.model_dump(mode="json") == saved
    assert second.wait(again, poll_s=0.1, timeout_s=60).ok
    assert second.tail(again) == "done\n"
    with pytest.raises(RemoteJobError, match="no job"):
        second.attach("never-launched")


# -- job slots: at most max_concurrent_jobs jobs that take a slot, per host, whoever launches them ----------------
STAMP = 'date +%s.%N > "$1.start"; sleep "$2"; date +%s.%N > "$1.end"'


def _stamps(t: Transport, path: str) -> tuple[float, float]:
    return float(t.read_text(f"{path}.start")), float(t.read_text(f"{path}.end"))


def test_two_controllers_share_the_hosts_job_slots(make_transport: MakeTransport, area: str) -> None:
    mine, theirs = make_transport(max_concurrent_jobs=1), make_transport(max_concurrent_jobs=1)
    mine.mkdir(area)
    a = mine.launch(JobSpec(["bash", "-c", STAMP, "x", mine.path(f"{area}/a"), "1.5"], name="a", take_slot=True))
    _eventually(lambda: mine.exists(f"{area}/a.start"), f"{area}/a.start appeared")
    b = theirs.launch(JobSpec(["bash", "-c", STAMP, "x", theirs.path(f"{area}/b"), "0"], name="b", take_slot=True))
    free = theirs.launch(JobSpec(["bash", "-c", STAMP, "x", theirs.path(f"{area}/free"), "0"], name="free"))
    assert theirs.wait(free, poll_s=0.1, timeout_s=30).ok  # a job that takes no slot does not wait
    assert theirs.status(b) == JobState("running")
    assert theirs.slot_note(b).startswith("waiting for one of the host's 1 job slot(s) (max_concurrent_jobs) since ")
    assert not theirs.exists(f"{area}/b.start")
    assert mine.wait(a, poll_s=0.1, timeout_s=60).ok
    assert theirs.wait(b, poll_s=0.1, timeout_s=60).ok
    assert _stamps(mine, f"{area}/a")[1] <= _stamps(theirs, f"{area}/b")[0]  # b started after a ended
    assert theirs.slot_note(b).startswith("holding job slot 0 of 1 since ")
    assert theirs.slot_note(free) == ""


def test_two_slots_let_two_jobs_run_at_once(make_transport: MakeTransport, area: str) -> None:
    t = make_transport(max_concurrent_jobs=2)
    t.mkdir(area)
    # each job waits (up to 10 s) for the other to have started: only two jobs running at once both succeed
    meet = 'touch "$1"; for i in $(seq 200); do [ -e "$2" ] && exit 0; sleep 0.05; done; exit 1'
    handles = [t.launch(JobSpec(["bash", "-c", meet, "x", t.path(f"{area}/{me}"), t.path(f"{area}/{other}")],
                                name=me, take_slot=True)) for me, other in (("p", "q"), ("q", "p"))]
    assert [t.wait(h, poll_s=0.1, timeout_s=60) for h in handles] == [JobState("exited", 0)] * 2
    assert sorted(t.slot_note(h)[:len("holding job slot 0")] for h in handles) == [
        "holding job slot 0", "holding job slot 1"]


def test_a_cancelled_job_gives_its_slot_back_and_a_waiting_one_never_runs(transport: Transport, area: str
                                                                          ) -> None:
    transport.mkdir(area)
    holder = transport.launch(JobSpec(["sleep", "300"], name="holder", take_slot=True))
    queued = transport.launch(JobSpec(["bash", "-c", STAMP, "x", transport.path(f"{area}/queued"), "0"],
                                      name="queued", take_slot=True))
    never = transport.launch(JobSpec(["bash", "-c", STAMP, "x", transport.path(f"{area}/never"), "0"],
                                     name="never", take_slot=True))
    _eventually(lambda: transport.slot_note(never).startswith("waiting"), "the job wrote a 'waiting' slot note")
    assert transport.cancel(never, grace_s=1) == JobState("cancelled")  # cancelled while waiting: never ran
    assert transport.cancel(holder, grace_s=1) == JobState("cancelled")
    assert transport.wait(queued, poll_s=0.1, timeout_s=60).ok  # the slot came back with the holder's end
    assert transport.exists(f"{area}/queued.end")
    assert not transport.exists(f"{area}/never.start")


def test_wait_times_out_without_touching_the_job(transport: Transport) -> None:
    handle = transport.launch(JobSpec(["sleep", "20"], name="slow"))
    try:
        with pytest.raises(CommandTimeout, match="still running"):
            transport.wait(handle, poll_s=0.1, timeout_s=0.3)
        assert transport.status(handle) == JobState("running")
    finally:
        transport.cancel(handle, grace_s=1)


# -- transfers -----------------------------------------------------------------------------------------------------
def _tree(root: Path) -> Path:
    (root / "sub dir").mkdir(parents=True)
    (root / "w.bin").write_bytes(os.urandom(300_000))
    (root / "sub dir" / "it's;$(x).json").write_text('{"k": 1}')
    return root


def test_put_and_get_round_trip_verified(transport: Transport, area: str, tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    seen: list[tuple[int, int]] = []
    fp = transport.put(str(src), f"{area}/ckpt", progress=lambda d, t: seen.append((d, t)))
    assert fp == fingerprint(src)
    assert seen
    assert seen[-1] == (fp.size, fp.size)
    assert transport.sha256([f"{area}/ckpt"])[f"{area}/ckpt"] == fp
    back = transport.get(f"{area}/ckpt", str(tmp_path / "back"))
    assert back == fp
    assert fingerprint(tmp_path / "back") == fp
    one = transport.get(f"{area}/ckpt/w.bin", str(tmp_path / "w.bin"))
    assert (tmp_path / "w.bin").read_bytes() == (src / "w.bin").read_bytes()
    assert one.kind == "file"
    left = transport.run(["bash", "-c", f"ls -A {area}"]).stdout.split()
    assert left == ["ckpt"]  # no staging leftovers
    assert not any(p.name.startswith(".af-partial") for p in tmp_path.iterdir())


def test_a_source_named_like_a_wildcard_is_copied_as_itself(transport: Transport, area: str,
                                                            tmp_path: Path) -> None:
    """rsync -s expands wildcards in a remote source itself, component by component: `*` once sent its whole
    directory, and an escaped backslash in a component without wildcards named nothing (both found by
    tests/faults/test_path_property.py)."""
    names = ["*", "a", "q?", "qx", "[a]", "c\\*d", "c\\xd", "e\\f", "w*x/a\\b", "'\\{/`*-~/f"]
    for name in names:
        transport.write_text(f"{area}/flat/{name}", f"content of {name!r}")
    for sub in ("d*", "dd"):
        transport.write_text(f"{area}/{sub}/inner", f"inside {sub}")
    for name in names:
        back = tmp_path / f"back-{names.index(name)}"
        fp = transport.get(f"{area}/flat/{name}", str(back))
        assert fp.kind == "file", name
        assert back.read_text() == f"content of {name!r}"
    fp = transport.get(f"{area}/d*", str(tmp_path / "dir"))
    assert fp.kind == "dir"
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["inner"]
    assert (tmp_path / "dir" / "inner").read_text() == "inside d*"


def test_copy_to_existing_identical_content_moves_nothing_and_different_content_is_not_overwritten(
        transport: Transport, area: str, tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    transport.put(str(src), f"{area}/ckpt")
    before = transport.stat(f"{area}/ckpt/w.bin")
    transport.put(str(src), f"{area}/ckpt")  # identical: nothing moves
    assert transport.stat(f"{area}/ckpt/w.bin") == before
    (src / "w.bin").write_bytes(b"changed")
    with pytest.raises(PathExists, match="different content"):
        transport.put(str(src), f"{area}/ckpt")
    assert transport.stat(f"{area}/ckpt/w.bin") == before
    fp = transport.put(str(src), f"{area}/ckpt", overwrite=True)
    assert transport.sha256([f"{area}/ckpt"])[f"{area}/ckpt"] == fp == fingerprint(src)


def test_a_file_changed_between_hashing_and_copying_is_refused_at_the_destination(
        transport: Transport, area: str, tmp_path: Path) -> None:
    transport.write_text(f"{area}/w.json", '{"weights": 1}')
    recorded = transport.sha256([f"{area}/w.json"])[f"{area}/w.json"]
    transport.write_text(f"{area}/w.json", '{"weights": 2}')  # changed after it was fingerprinted
    with pytest.raises(FingerprintMismatch, match="refused") as info:
        copy_between(transport, f"{area}/w.json", transport, f"{area}/copy.json", expected=recorded)
    assert info.value.expected == recorded.sha256
    assert not transport.exists(f"{area}/copy.json")
    assert sorted(transport.run(["ls", "-A", area]).stdout.split()) == ["w.json"]


def test_a_command_killed_by_a_signal_reports_128_plus_the_signal(transport: Transport) -> None:
    done = transport.run(["bash", "-c", "kill -KILL $$"], check=False)
    assert done.exit_code == 128 + 9


def test_hashing_while_a_copy_arrives_reports_the_final_bytes(transport: Transport, area: str) -> None:
    root = f"{area}/incoming"
    follower = transport.follow_sha256(root)
    transport.write_text(f"{root}/a.txt", "first")
    transport.write_text(f"{root}/.tmp-in-progress", "ignored until the end")
    time.sleep(0.6)  # the follower hashes a.txt now ...
    transport.run(["bash", "-c", f"printf FIRST > {root}/a.txt"])  # ... and it is rewritten (same size) later
    transport.run(["bash", "-c", f"printf partial > {root}/b.bin; sleep 0.5; printf more >> {root}/b.bin"])
    got = follower.result()
    assert got == transport.sha256([root], memo=False)[root]
    assert {f.path for f in got.files} == {"a.txt", ".tmp-in-progress", "b.bin"}


def test_an_aborted_follower_stops_at_once(transport: Transport, area: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"{area}/incoming"
    transport.write_text(f"{root}/a.txt", "arrived")  # at end-of-file the follower would hash it and exit 0
    follower = transport.follow_sha256(root)
    spawned = follower.spawned
    finish, finished = spawned.finish, []

    def recording_finish(timeout_s: float | None = None) -> Result:
        finished.append(finish(timeout_s))
        return finished[-1]

    monkeypatch.setattr(spawned, "finish", recording_finish)
    follower.abort()
    # 3 is follow_hash's "aborted": it understood "abort" and hashed nothing, rather than seeing end-of-file
    assert [(r.exit_code, r.stdout) for r in finished] == [(3, b"")]
    assert root not in transport.run(["ps", "-eo", "args"]).stdout  # the follower is gone


def test_a_directory_changed_after_it_was_fingerprinted_is_refused_and_the_diff_named(
        transport: Transport, area: str) -> None:
    transport.write_text(f"{area}/ckpt/a.json", "1")
    transport.write_text(f"{area}/ckpt/b.json", "2")
    recorded = transport.sha256([f"{area}/ckpt"])[f"{area}/ckpt"]
    transport.write_text(f"{area}/ckpt/b.json", "3")
    with pytest.raises(FingerprintMismatch, match=r"differing files: b\.json"):
        copy_between(transport, f"{area}/ckpt", transport, f"{area}/copy", expected=recorded)
    assert not transport.exists(f"{area}/copy")


def test_a_host_without_flock_fails_the_job_with_a_clear_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """A real host without util-linux's flock: the local host, with a PATH that has every tool but flock."""
    from alignflow.config.hosts import Host
    from alignflow.transport import open_transport
    from alignflow.transport.jobs_direct import NO_FLOCK_EXIT

    tools = tmp_path / "bin"
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if tool.name != "flock" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    monkeypatch.setenv("PATH", str(tools))
    host = Host(name="no-flock", role="cpu", transport="local", workdir=str(tmp_path / "wd"))
    with open_transport(host) as t:
        handle = t.launch(JobSpec(["true"], name="needs-a-slot", take_slot=True))
        assert t.wait(handle, poll_s=0.1, timeout_s=30) == JobState("exited", NO_FLOCK_EXIT)
        assert "this host has no flock (util-linux)" in t.tail(handle, stream="stderr")
        plain = t.launch(JobSpec(["true"], name="no-slot"))
        assert t.wait(plain, poll_s=0.1, timeout_s=30).ok  # jobs that take no slot do not need it


def test_output_written_after_the_command_exited_is_read_to_the_end(transport: Transport) -> None:
    # A process the command left behind keeps writing: sshd sends the exit status first and this output after
    # it (CI once lost the link this way). The result is complete only at the end of the output, as locally.
    script = "(sleep 0.5; echo late; echo late-err >&2) & echo early"
    done = transport.run(["sh", "-c", script])
    assert done.stdout == "early\nlate\n"
    assert done.stderr.endswith("late-err\n")



def test_a_launch_that_gave_up_on_its_supervisor_leaves_nothing_running(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch that waited for its supervisor's pid in vain (a loaded host; here it waits 0 s) fails, marks the job
    cancelled and kills what it started; a supervisor that starts after all finds the mark and runs nothing: no
    record holds that job for a cancellation to find."""
    from alignflow.config.hosts import Host
    from alignflow.errors import AlignflowError
    from alignflow.transport import open_transport
    from alignflow.transport.jobs_direct import DirectJobs, supervisor_script

    monkeypatch.setattr(DirectJobs, "start_wait_s", 0)
    ran = tmp_path / "ran"
    host = Host(name="slow-start", role="cpu", transport="local", workdir=str(tmp_path / "wd"))
    with open_transport(host) as t, pytest.raises(AlignflowError, match="did not start within 0 s"):
        t.launch(JobSpec(["bash", "-c", f"touch {ran}; sleep 30"], name="late", job_id="late"))
    job = tmp_path / "wd" / "jobs" / "late"
    assert (job / "cancelled").exists()
    _eventually(lambda: not _running_in(job), "the launch's processes ended")
    assert not ran.exists()
    # the supervisor that starts after the launch gave up (its kill missed it): it writes its pid and stops
    late = tmp_path / "late"
    late.mkdir()
    (late / "cmd.sh").write_text(f"touch {ran}\n")
    (late / "cancelled").touch()
    for slots in (None, 1):
        script = supervisor_script(slots, str(tmp_path / "slots"))
        assert subprocess.run(["bash", "-c", script], cwd=late, check=False).returncode == 0
        assert (late / "pid").exists()
        assert not ran.exists()
        assert not (late / "exit_code").exists()


def _running_in(folder: Path) -> bool:
    """Whether a live process has `folder` as its working directory."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd") == str(folder.resolve()):
                return True
        except OSError:
            continue
    return False
