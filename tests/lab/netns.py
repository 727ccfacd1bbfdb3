"""A private network namespace for lab daemons that would otherwise listen on every interface.

slurmctld and slurmd bind `0.0.0.0` (Slurm 22.05 has no bind-address setting), and this machine has a real
network interface. So the lab runs them inside a network namespace whose only interface is loopback, and lets
the outside reach exactly one port through a forwarder that listens on 127.0.0.1 of the machine. The same trick
puts an SSH lab host where only another lab host can reach it (the ProxyJump test).

Every process of the namespace is the lab's: `close()` ends them all (daemons, slurmstepd, the jobs they
started), found by their `/proc/PID/ns/net`, so nothing outlives the lab. Needs root (`unshare --net`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_CLONE_NEWNET = 0x40000000
# Loopback up, plus one link-local IPv4 address on a veth pair that never leaves the namespace: glibc's
# getaddrinfo(AI_ADDRCONFIG), which Slurm uses to bind, finds no IPv4 address on loopback alone.
_SETUP = ("ip link set lo up && ip link add afv0 type veth peer name afv1 && ip addr add 169.254.77.1/32 dev afv0 "
          "&& ip link set afv0 up && ip link set afv1 up && ")
_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """preexec_fn: the child is killed when the lab's process dies (no orphaned daemon after a crashed test)."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _netns_inode(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class NetNamespace:
    """A network namespace with loopback up, held open by one `sleep` process."""

    def __init__(self, holder: subprocess.Popen[bytes]) -> None:
        self.holder = holder
        self.path = f"/proc/{holder.pid}/ns/net"
        self.inode = _netns_inode(holder.pid)
        self._forwarders: list[Forwarder] = []

    @classmethod
    def start(cls) -> NetNamespace:
        holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", _SETUP + "exec sleep infinity"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  preexec_fn=die_with_parent)
        ours = _netns_inode("self")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if holder.poll() is not None:
                err = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
                raise RuntimeError(f"unshare --net failed ({holder.returncode}): {err.strip()}")
            inode = _netns_inode(holder.pid)
            if inode is not None and inode != ours and _comm(holder.pid) == "sleep":
                return cls(holder)
            time.sleep(0.02)
        holder.kill()
        raise RuntimeError("the network namespace's holder did not start")

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        """Start `argv` inside the namespace (nsenter execs it: the Popen's pid is the program's)."""
        return subprocess.Popen(["nsenter", f"--net={self.path}", "--", *argv], preexec_fn=die_with_parent, **kw)

    def run(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", f"--net={self.path}", "--", *argv], capture_output=True, text=True,
                              check=False, **kw)

    def forward(self, address: str, port: int, target: tuple[str, int]) -> Forwarder:
        """Listen on `address:port` of the machine; every connection is relayed to `target` in the namespace."""
        fwd = Forwarder(self.path, (address, port), target)
        self._forwarders.append(fwd)
        return fwd

    def pids(self) -> list[int]:
        """Every process in the namespace except its holder."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.holder.pid and _netns_inode(entry) == self.inode:
                out.append(int(entry))
        return out

    def close(self, *, grace_s: float = 5.0) -> None:
        """End every process of the namespace (TERM, then KILL after `grace_s`), the forwarders, the holder."""
        for fwd in self._forwarders:
            fwd.close()
        deadline = time.monotonic() + grace_s
        sig = signal.SIGTERM
        while True:
            pids = self.pids()
            if not pids:
                break
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, sig)
            if time.monotonic() > deadline:
                sig = signal.SIGKILL
            if time.monotonic() > deadline + 10:
                break
            time.sleep(0.1)
        self.holder.kill()
        self.holder.wait(timeout=10)
        if self.holder.stderr is not None:
            self.holder.stderr.close()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Forwarder:
    """A TCP relay: accepts on the machine's loopback, connects inside a network namespace.

    The listening socket is made before the relay thread enters the namespace (`setns` applies to the calling
    thread only), so it stays on the machine; every socket the thread makes afterwards is in the namespace.
    """

    def __init__(self, ns_path: str, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen, self.target = listen, target
        self._sock = socket.create_server(listen)
        self._sock.settimeout(0.2)
        self._closed = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, args=(ns_path,), daemon=True,
                                        name=f"lab-forward-{listen[1]}")
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"forwarder {listen} -> {target}: {self._error}")

    def _serve(self, ns_path: str) -> None:
        try:
            fd = os.open(ns_path, os.O_RDONLY)
            try:
                if _libc().setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        self._thread.join(timeout=5)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                s.shutdown(how)
        _close_when_both_done(src, dst)


_done: dict[int, int] = {}
_done_lock = threading.Lock()


def _close_when_both_done(a: socket.socket, b: socket.socket) -> None:
    key = id(a) ^ id(b)
    with _done_lock:
        _done[key] = _done.get(key, 0) + 1
        last = _done[key] == 2
        if last:
            del _done[key]
    if last:
        for s in (a, b):
            s.close()


def reap_stale(glob: str, alive: Callable[[Path], bool]) -> None:
    """End the processes of lab namespaces whose lab died without `close()` (their `netns` file names the
    namespace inode; `alive(lab_dir)` says whether that lab is still in use)."""
    for marker in Path("/tmp").glob(f"{glob}/netns"):
        lab = marker.parent
        if alive(lab):
            continue
        try:
            inode = int(marker.read_text().strip())
        except (OSError, ValueError):
            continue
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _netns_inode(entry) == inode:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)
        with contextlib.suppress(OSError):
            marker.unlink()
