"""The jump lab: two real sshd hosts, the inner one reachable only through the other (ProxyJump).

```
bastion  127.0.0.14  sshd in a private network namespace, its port relayed to the machine's 127.0.0.14
inner    127.0.0.15  sshd in the same namespace, nothing relayed: from the machine, connection refused
```

Both are users and sshd configs made exactly as the SSH lab's (tests/lab/sshd.py), one client key authorized on
both, one managed known_hosts with both keys. The bastion allows TCP forwarding (`direct-tcpip`, what `ssh -J`
and paramiko's jump channel open); the inner host does not need to. `close()` ends both servers, every session
they started and the lab users.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from alignflow.config.hosts import Host
from tests.lab.netns import NetNamespace
from tests.lab.sshd import GECOS, REPO_ROOT, SSHD, LabHost, LabUnavailable, _make_traversable, _run, _sshd_config

JUMP_HOSTS: dict[str, tuple[str, str]] = {"bastion": ("127.0.0.14", "controller"), "inner": ("127.0.0.15", "cuda")}


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class JumpLab:
    def __init__(self, root: Path, ns: NetNamespace, client_key: Path, known_hosts: Path, python: str,
                 pythonpath: str) -> None:
        self.root, self.ns, self.client_key, self.known_hosts = root, ns, client_key, known_hosts
        self.python, self.pythonpath = python, pythonpath
        self.hosts: dict[str, LabHost] = {}

    @classmethod
    def start(cls, *, python: str = sys.executable, checkout: Path = REPO_ROOT) -> JumpLab:
        if os.geteuid() != 0:
            raise LabUnavailable("the jump lab needs root (useradd, sshd, a network namespace)")
        missing = [t for t in (SSHD, "useradd", "userdel", "ssh-keygen", "rsync", "ssh", "unshare", "nsenter")
                   if shutil.which(t) is None]
        if missing:
            raise LabUnavailable(f"missing {', '.join(missing)}: install openssh-server, rsync, util-linux")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="alignflow-jumplab-"))
        root.chmod(0o711)
        client = root / "client"
        client.mkdir(mode=0o700)
        key = client / "id_ed25519"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alignflow-jumplab-client", "-f", str(key)])
        for path in (Path(python).resolve().parent, Path(python).parent, checkout):
            _make_traversable(path)
        lab = cls(root, NetNamespace.start(), key, client / "known_hosts", python, str(checkout))
        try:
            tag = secrets.token_hex(3)
            for name in JUMP_HOSTS:
                lab.hosts[name] = lab._create_host(name, tag)
            lab.known_hosts.write_text("".join(lab.known_hosts_line(n) for n in lab.hosts))
            for name, h in lab.hosts.items():
                config = _sshd_config(h)
                if name == "bastion":
                    config = config.replace("AllowTcpForwarding no", "AllowTcpForwarding yes")
                (h.sshd_dir / "sshd_config").write_text(config)
                h.process = lab.ns.popen([SSHD, "-D", "-f", str(h.sshd_dir / "sshd_config"), "-E",
                                          str(h.sshd_dir / "sshd.log")], stdin=subprocess.DEVNULL)
            bastion = lab.hosts["bastion"]
            lab.ns.forward(bastion.address, bastion.port, (bastion.address, bastion.port))
            lab._wait_banner(bastion)
        except BaseException:
            lab.close()
            raise
        return lab

    def _create_host(self, name: str, tag: str) -> LabHost:
        address, role = JUMP_HOSTS[name]
        user = f"af-{tag}-j{name}"[:32]
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
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"lab-{name}", "-f",
              str(sshd_dir / "ssh_host_ed25519_key")])
        _run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-C", f"lab-{name}", "-f",
              str(sshd_dir / "ssh_host_ecdsa_key")])
        return LabHost(name, role, address, _free_port(address), user, pw.pw_uid, home, home / "work", sshd_dir)

    def _wait_banner(self, h: LabHost) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert h.process is not None
            if h.process.poll() is not None:
                log = (h.sshd_dir / "sshd.log").read_text(errors="replace")[-2000:]
                raise LabUnavailable(f"sshd for jump lab host {h.name} exited {h.process.returncode}:\n{log}")
            with contextlib.suppress(OSError), socket.create_connection((h.address, h.port), timeout=1) as s:
                s.settimeout(2)
                if s.recv(8).startswith(b"SSH-"):
                    return
            time.sleep(0.05)
        raise LabUnavailable(f"sshd for jump lab host {h.name} did not answer on {h.address}:{h.port}")

    def known_hosts_line(self, name: str) -> str:
        h = self.hosts[name]
        kind, key = (h.sshd_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"[{h.address}]:{h.port} {kind} {key}\n"

    def host(self, name: str, **overrides: Any) -> Host:
        h = self.hosts[name]
        fields: dict[str, Any] = {
            "name": name, "role": h.role, "transport": "ssh", "address": h.address, "port": h.port, "user": h.user,
            "identity_file": str(self.client_key), "known_hosts": str(self.known_hosts), "workdir": str(h.workdir),
            "python": self.python, "env": {"PYTHONPATH": self.pythonpath}, "connect_timeout_s": 5.0,
        }
        return Host(**{**fields, **overrides})

    def inner_via_bastion(self, **overrides: Any) -> Host:
        """The inner host as hosts.yaml would give it: `proxy_jump: <bastion user>@<address>:<port>`."""
        b = self.hosts["bastion"]
        return self.host("inner", proxy_jump=f"{b.user}@{b.address}:{b.port}", **overrides)

    def user_pids(self, name: str) -> list[int]:
        uid = self.hosts[name].uid
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        out.append(int(entry))
        return out

    def close(self) -> None:
        self.ns.close()
        for h in self.hosts.values():
            if h.process is not None:
                with contextlib.suppress(Exception):
                    h.process.wait(timeout=10)
            for _ in range(20):
                pids = self.user_pids(h.name)
                if not pids:
                    break
                for p in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, 9)
                time.sleep(0.05)
            subprocess.run(["userdel", h.user], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
