"""The SSH lab: real OpenSSH servers on loopback, one per lab host, each with its own Unix user.

```
127.0.0.11  ascend   user af-<id>-ascend   workdir <lab>/ascend/home/work (mode 700)
127.0.0.12  cpu      user af-<id>-cpu      ...
127.0.0.13  cuda     user af-<id>-cuda     ...
```

Each server has its own generated host keys and its own `sshd_config` (keys only, `AllowUsers` its one
user, StrictModes on); the test client has one key authorized everywhere and a managed known_hosts with
every server's key. Because every host is a different user with a private workdir, a file can reach another
lab host only through the transport - the property the transfer tests rely on.

The lab hosts run alignflow's Python: `python` is the controller's interpreter and `PYTHONPATH` (in the host
env) points at the checkout. Those must be readable by the lab users; where an ancestor directory is not
traversable by others (e.g. a checkout or pyenv under /root, mode 700), `o+x` - traverse only, no listing -
is added and left in place (several labs may run at once, so no lab restores it under another's feet).

Needs root (useradd, sshd) and openssh-server + rsync (`.ci/run` installs them). Used by the tests
(`ssh_lab` fixture in tests/conftest.py) and by benchmarks/bench_transfer.py.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alignflow.config.hosts import Host

LAB_HOSTS: dict[str, tuple[str, str]] = {  # name -> (address, role)
    "ascend": ("127.0.0.11", "ascend"),
    "cpu": ("127.0.0.12", "cpu"),
    "cuda": ("127.0.0.13", "cuda"),
}
PRIVSEP_DIR = "/run/sshd"  # Debian's OpenSSH: `_PATH_PRIVSEP_CHROOT_DIR` (sshd(8) FILES)
SSHD = "/usr/sbin/sshd"
GECOS = "alignflow ssh lab"
REPO_ROOT = Path(__file__).resolve().parents[2]


class LabUnavailable(RuntimeError):
    """The lab cannot start here; the message says what to install or how to run."""


@dataclass
class LabHost:
    name: str
    role: str
    address: str
    port: int
    user: str
    uid: int
    home: Path
    workdir: Path
    sshd_dir: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def listener_pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _make_traversable(path: Path) -> None:
    """Add o+x to every ancestor of `path` that lacks it (see the module docstring)."""
    for parent in [path, *path.parents]:
        if not parent.is_dir():
            continue
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _process_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, comm, uid) for every process; small /proc reader (no psutil here)."""
    table: dict[int, tuple[int, str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        ppid = int(raw[raw.rindex(")") + 2 :].split()[1])
        table[int(entry)] = (ppid, comm, uid)
    return table


def _descendants(pid: int) -> list[int]:
    table = _process_table()
    out, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _, _) in table.items():
            if ppid == parent:
                out.append(child)
                frontier.append(child)
    return out


def ensure_privsep_dir() -> None:
    """sshd refuses to run, `sshd -t` included, without its privilege-separation directory, which only an init system
    or an earlier sshd creates: on a fresh machine (a new CI runner) nothing has. Root only, as the lab is."""
    Path(PRIVSEP_DIR).mkdir(mode=0o755, exist_ok=True)


class SSHLab:
    """Start with `SSHLab.start()`, stop with `close()`. As alignflow config: `host(name)`, `write_hosts_yaml(path)`."""

    def __init__(self, root: Path, hosts: dict[str, LabHost], client_key: Path, known_hosts: Path,
                 python: str, pythonpath: str) -> None:
        self.root, self.hosts, self.client_key, self.known_hosts = root, hosts, client_key, known_hosts
        self.python, self.pythonpath = python, pythonpath

    # -- lifecycle -----------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, names: tuple[str, ...] = tuple(LAB_HOSTS), *, python: str = sys.executable,
              checkout: Path = REPO_ROOT) -> SSHLab:
        if os.geteuid() != 0:
            raise LabUnavailable("the SSH lab needs root: it creates Unix users (useradd) and runs sshd servers; "
                                 "run the tests as root (CI does) or under sudo")
        missing = [t for t in (SSHD, "useradd", "userdel", "ssh-keygen", "rsync", "ssh", "runuser")
                   if shutil.which(t) is None]
        if missing:
            raise LabUnavailable(f"missing {', '.join(missing)}: install openssh-server, openssh-client and rsync "
                                 "(.ci/run does)")
        _reap_stale_users()
        ensure_privsep_dir()
        root = Path(tempfile.mkdtemp(prefix="alignflow-lab-"))
        root.chmod(0o711)
        client = root / "client"
        client.mkdir(mode=0o700)
        key = client / "id_ed25519"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alignflow-lab-client", "-f", str(key)])
        lab = cls(root, {}, key, client / "known_hosts", python, str(checkout))
        for path in (Path(python).resolve().parent, Path(python).parent, checkout):
            _make_traversable(path)
        tag = secrets.token_hex(3)
        try:
            for name in names:
                lab.hosts[name] = lab._create_host(name, tag)
            lab.known_hosts.write_text("".join(lab.known_hosts_line(n) for n in lab.hosts))
            lab._check_python(next(iter(lab.hosts)))
            for name in lab.hosts:
                lab.start_sshd(name)
        except BaseException:
            lab.close()
            raise
        return lab

    def _create_host(self, name: str, tag: str) -> LabHost:
        address, role = LAB_HOSTS[name]
        user = f"af-{tag}-{name}"[:32]
        base = self.root / name
        base.mkdir(mode=0o711)
        home = base / "home"
        _run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--password", "*",
              "--comment", f"{GECOS} {self.root}", "--user-group", user])
        pw = pwd.getpwnam(user)
        (home / ".ssh").mkdir(parents=True)
        (home / "work").mkdir()
        auth = home / ".ssh" / "authorized_keys"
        auth.write_text(Path(f"{self.client_key}.pub").read_text())
        for p, mode in ((home, 0o700), (home / ".ssh", 0o700), (auth, 0o600), (home / "work", 0o700)):
            os.chown(p, pw.pw_uid, pw.pw_gid)
            p.chmod(mode)
        sshd_dir = base / "sshd"
        sshd_dir.mkdir(mode=0o700)
        for kind in ("ed25519", "ecdsa"):
            _run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"lab-{name}", "-f",
                  str(sshd_dir / f"ssh_host_{kind}_key")])
        host = LabHost(name, role, address, _free_port(address), user, pw.pw_uid, home, home / "work", sshd_dir)
        (sshd_dir / "sshd_config").write_text(_sshd_config(host))
        return host

    def _check_python(self, name: str) -> None:
        probe = self.run_as(name, ["env", f"PYTHONPATH={self.pythonpath}", self.python, "-c",
                                   "import alignflow.fingerprint"])
        if probe.returncode != 0:
            raise LabUnavailable(
                f"lab user {self.hosts[name].user} cannot run {self.python} with the checkout {self.pythonpath}: "
                f"{probe.stderr.strip()[-500:]}; the interpreter, its packages and the checkout must be readable "
                "by other users"
            )

    def known_hosts_line(self, name: str) -> str:
        h = self.hosts[name]
        kind, key = (h.sshd_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"[{h.address}]:{h.port} {kind} {key}\n"

    def start_sshd(self, name: str) -> None:
        h = self.hosts[name]
        if h.listener_pid is not None:
            return
        h.process = subprocess.Popen([SSHD, "-D", "-f", str(h.sshd_dir / "sshd_config"), "-E",
                                      str(h.sshd_dir / "sshd.log")], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if h.process.poll() is not None:
                log = (h.sshd_dir / "sshd.log").read_text(errors="replace")[-2000:]
                raise LabUnavailable(f"sshd for lab host {name} exited {h.process.returncode}:\n{log}")
            with contextlib.suppress(OSError), socket.create_connection((h.address, h.port), timeout=1) as s:
                s.settimeout(2)
                if s.recv(8).startswith(b"SSH-"):
                    return
            time.sleep(0.05)
        raise LabUnavailable(f"sshd for lab host {name} did not answer on {h.address}:{h.port}")

    def stop_sshd(self, name: str) -> None:
        """Stop the listener and drop its connections (the host is 'down')."""
        h = self.hosts[name]
        if h.process is None:
            return
        self.kill_connections(name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(h.process.pid, signal.SIGCONT)
        h.process.terminate()
        h.process.wait(timeout=10)
        h.process = None

    def pause_sshd(self, name: str) -> None:
        """SIGSTOP the listener: the kernel still accepts TCP connections, but no SSH banner ever comes."""
        pid = self.hosts[name].listener_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)

    def resume_sshd(self, name: str) -> None:
        pid = self.hosts[name].listener_pid
        assert pid is not None
        os.kill(pid, signal.SIGCONT)

    def connection_pids(self, name: str) -> list[int]:
        """The per-connection sshd processes of a lab host (children of its listener)."""
        pid = self.hosts[name].listener_pid
        if pid is None:
            return []
        table = _process_table()
        return [p for p in _descendants(pid) if table.get(p, (0, "", 0))[1] in ("sshd", "sshd-session")]

    def kill_connections(self, name: str) -> int:
        """Cut every SSH connection to a lab host (kill their sshd processes); commands they started live on."""
        pids = self.connection_pids(name)
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        return len(pids)

    def user_pids(self, name: str) -> list[int]:
        uid = self.hosts[name].uid
        return [p for p, (_, _, u) in _process_table().items() if u == uid]

    def run_as(self, name: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """Run a command locally as a lab host's user (to prove what that user can and cannot read)."""
        return subprocess.run(["runuser", "-u", self.hosts[name].user, "--", *argv], capture_output=True, text=True,
                              check=False)

    def close(self) -> None:
        for name in list(self.hosts):
            with contextlib.suppress(Exception):
                self.stop_sshd(name)
        for name, h in self.hosts.items():
            for _ in range(20):
                pids = self.user_pids(name)
                if not pids:
                    break
                for p in pids:  # the lab users' own processes (e.g. jobs a test left running), by pid
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
                time.sleep(0.05)
            subprocess.run(["userdel", h.user], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- as alignflow config -------------------------------------------------------------------------------------
    def host(self, name: str, **overrides: Any) -> Host:
        h = self.hosts[name]
        fields: dict[str, Any] = {
            "name": name, "role": h.role, "transport": "ssh", "address": h.address, "port": h.port, "user": h.user,
            "identity_file": str(self.client_key), "known_hosts": str(self.known_hosts), "workdir": str(h.workdir),
            "python": self.python, "env": {"PYTHONPATH": self.pythonpath}, "connect_timeout_s": 5.0,
        }
        return Host(**{**fields, **overrides})

    def write_hosts_yaml(self, path: Path, *, overrides: dict[str, dict[str, Any]] | None = None) -> Path:
        """A hosts.yaml for the lab (flow tests reuse it); `overrides` per host name, e.g. extra env."""
        body = {}
        for name in self.hosts:
            data = self.host(name, **(overrides or {}).get(name, {})).model_dump(exclude={"name"})
            body[name] = {k: v for k, v in data.items() if v not in (None, [], {})}
        path.write_text(yaml.safe_dump({"hosts": body}, sort_keys=False))
        return path


def _sshd_config(h: LabHost) -> str:
    return "\n".join([
        f"ListenAddress {h.address}:{h.port}",
        *(f"HostKey {h.sshd_dir / f'ssh_host_{k}_key'}" for k in ("ed25519", "ecdsa")),
        f"PidFile {h.sshd_dir / 'sshd.pid'}",
        "AuthorizedKeysFile .ssh/authorized_keys",
        f"AllowUsers {h.user}",
        "PermitRootLogin no",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes yes",
        "AllowAgentForwarding yes",
        "AllowTcpForwarding no",
        "X11Forwarding no",
        "PermitUserEnvironment no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "MaxStartups 64:30:128",
        "MaxSessions 64",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _reap_stale_users() -> None:
    """Remove lab users left by a lab that died without cleaning up (its directory is gone)."""
    for pw in pwd.getpwall():
        if not pw.pw_gecos.startswith(GECOS):
            continue
        lab_root = pw.pw_gecos[len(GECOS):].strip()
        if lab_root and Path(lab_root).exists():
            continue  # another lab, still running
        if any(u == pw.pw_uid for _, _, u in _process_table().values()):
            continue
        subprocess.run(["userdel", pw.pw_name], capture_output=True, check=False)
