"""The cases of issue 16's adversarial pass that held, kept as tests so that they stay held.

(Heavier held cases live beside the code they exercise: a whole SSH demo surviving cut connections is
tests/flows/test_alignment_ssh.py; two processes on one SQLite store, tests/store/test_concurrency.py. The
light version of each is here.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from alignflow.errors import HostKeyRejected, PathNotAllowed
from alignflow.transport import JobSpec, JobState, open_transport
from tests.faults.conftest import SECRET, Site
from tests.lab.sshd import SSHLab
from tests.store.sample import run_params

pytestmark = pytest.mark.integration

METACHARACTERS = ["a; touch PWNED1", "$(touch PWNED2)", "`touch PWNED3`", "line1\nline2; touch PWNED4",
                  "it's", 'say "hi"', "$HOME", "* ?", "back\\slash", "| touch PWNED5 &"]


# --- SSH host keys -----------------------------------------------------------------------------------------------

def test_unknown_changed_and_other_port_host_keys_are_refused_with_fingerprint_and_how_to_trust(
        ssh_lab: SSHLab, tmp_path: Path) -> None:
    h = ssh_lab.hosts["cpu"]
    key = " ".join((h.sshd_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])
    wrong = " ".join((ssh_lab.hosts["ascend"].sshd_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])
    cases = {
        "unknown": ("", "unknown host key"),
        "changed": (f"[{h.address}]:{h.port} {wrong}\n", "CHANGED"),
        "other-port": (f"[{h.address}]:{h.port + 1} {key}\n{h.address} {key}\n", "unknown host key"),
    }
    for name, (content, fragment) in cases.items():
        known = tmp_path / f"known_hosts-{name}"
        known.write_text(content)
        with open_transport(ssh_lab.host("cpu", known_hosts=str(known))) as t, \
                pytest.raises(HostKeyRejected) as info:
            t.run(["touch", f"pwned-{name}"])
        assert fragment in str(info.value), name
        assert "SHA256:" in str(info.value), name
        if name != "changed":
            assert "alignflow hosts trust cpu" in str(info.value), name
        assert known.read_text() == content, name  # nothing was added
        assert not (h.workdir / f"pwned-{name}").exists()


# --- connection kills and an sshd outage during a job ---------------------------------------------------------------

def test_a_job_survives_three_connection_kills_and_an_8s_sshd_outage(ssh_lab: SSHLab) -> None:
    with open_transport(ssh_lab.host("ascend", connect_timeout_s=2.0)) as t:
        handle = t.launch(JobSpec(["bash", "-c", "for i in $(seq 1 14); do echo tick $i; sleep 1; done; exit 3"],
                                  name="outlives-its-connections"))
        result: list[JobState] = []
        waiter = threading.Thread(target=lambda: result.append(t.wait(handle, poll_s=0.3, timeout_s=120)))
        waiter.start()
        for _ in range(3):
            time.sleep(0.8)
            ssh_lab.kill_connections("ascend")
        ssh_lab.stop_sshd("ascend")
        try:
            time.sleep(8)
        finally:
            ssh_lab.start_sshd("ascend")
        waiter.join(timeout=120)
        assert result == [JobState("exited", 3)]
        assert t.tail(handle).splitlines()[-1] == "tick 14"


# --- metacharacters arrive literally ---------------------------------------------------------------------------------

def test_metacharacters_arrive_literally_in_argv_env_values_and_job_names(site: Site) -> None:
    echo = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['AF_VALUE']]))"
    for value in METACHARACTERS:
        done = site.t.run([site.t.python(), "-c", echo, value, "--", value], env={"AF_VALUE": value},
                          cwd=site.area)
        assert json.loads(done.stdout) == [[value, "--", value], value]
        job = site.t.launch(JobSpec([site.t.python(), "-c", echo, value], name=value, env={"AF_VALUE": value},
                                    cwd=site.area))
        assert site.t.wait(job, poll_s=0.1, timeout_s=60).ok
        assert json.loads(site.t.tail(job)) == [[value], value]
    found = site.t.run(["bash", "-c", "find . -name 'PWNED*'"]).stdout
    assert found == ""


# --- escapes by name are refused -------------------------------------------------------------------------------------

def test_dotdot_absolute_other_home_and_top_level_links_are_refused(site: Site) -> None:
    site.link("top-link", site.outside / "private.txt")
    site.link("dir-link", site.outside)
    for bad in ("../x", f"{site.area}/../../x", "/etc/passwd", "~root/.ssh/authorized_keys", f"{site.area}/top-link",
                f"{site.area}/dir-link/private.txt"):
        with pytest.raises(PathNotAllowed):
            site.t.read_text(bad)
        with pytest.raises(PathNotAllowed):
            site.t.sha256([bad])
        with pytest.raises(PathNotAllowed):
            site.t.write_text(bad, "x")
    assert (site.outside / "private.txt").read_bytes() == SECRET


# --- a damaged store is a clear error and stays as it was -----------------------------------------------------------

def _alignflow(env: dict[str, str], *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "alignflow", *args]
    if user is not None:
        argv = ["runuser", "-u", user, "--", "env", f"PYTHONPATH={env['PYTHONPATH']}", *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, cwd="/")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "read-only"])
def test_a_damaged_store_is_a_clear_error_and_the_file_is_untouched(tmp_path: Path, damage: str,
                                                                    subprocess_env: dict[str, str]) -> None:
    from alignflow.store import Store

    state = tmp_path / "state"
    with Store.open(state_dir=state) as store:
        store.ensure_experiment("e", config={}, config_sha256="0" * 64)
        store.create_run("e", trigger="t", code_version="v", params=run_params("e"), config_sha256="0" * 64)
    db = state / "store.sqlite"
    user = None
    if damage == "truncated":
        db.write_bytes(db.read_bytes()[:1000])
    elif damage == "garbage":
        db.write_bytes(os.urandom(8192))
    else:
        tmp_path.chmod(0o755)
        state.chmod(0o755)  # readable, not writable, by the user who runs the command
        user = "nobody"
    before = db.read_bytes()
    env = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(state)}
    done = _alignflow(env, "db", "upgrade", user=user) if damage == "read-only" else _alignflow(env, "history")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert str(db) in done.stderr or "store" in done.stderr, done.stderr
    assert db.read_bytes() == before


# --- logs: NaN and inf are fatal; <script> is escaped in the report ------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nan_and_inf_in_a_log_are_fatal(tmp_path: Path, value: float, subprocess_env: dict[str, str]) -> None:
    from tests.logfixtures import make_run, megatron_lines, mindformers_lines, write

    ref = make_run(20, seed=3)
    test = make_run(20, seed=3)
    test.lm_loss[9] = value
    write(tmp_path / "npu.log", mindformers_lines(test))
    write(tmp_path / "gpu.log", megatron_lines(ref))
    done = _alignflow(subprocess_env, "compare", str(tmp_path / "gpu.log"), str(tmp_path / "npu.log"), "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["verdict"] != "pass"
    assert "Traceback" not in done.stderr


def test_script_tags_in_logs_and_labels_are_escaped_in_the_report(tmp_path: Path,
                                                                   subprocess_env: dict[str, str]) -> None:
    from tests.logfixtures import make_run, megatron_lines, mindformers_lines, write

    run = make_run(20, seed=4)
    write(tmp_path / "npu.log", ["<script>alert('log')</script>\n", *mindformers_lines(run)])
    write(tmp_path / "gpu.log", megatron_lines(run))
    out = tmp_path / "report"
    _alignflow(subprocess_env, "compare", str(tmp_path / "gpu.log"), str(tmp_path / "npu.log"), "--out", str(out),
               "--labels", "GPU,<script>alert('npu')</script>", "--title", "<script>alert('t')</script>")
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<script>alert(" not in page
    assert "&lt;script&gt;alert(" in page
    shutil.rmtree(out)
