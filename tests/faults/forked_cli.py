"""`alignflow` commands as real processes that can be killed at any point, without paying their imports each time.

Each command of the interruption tests would spend ~2 CPU-s (5 s on the busy shared machine) importing torch,
safetensors, TensorBoard and MLflow before it writes a byte, so that most random kill points would land in imports
and a few seeds would cost minutes. A "zygote" process imports them once; for each command it forks a child that
runs `alignflow.cli.main` with the command's argv, cwd and environment, exactly as the console script does after
its imports. The child is a real process of its own (its own pid, signal handlers, open files, exit status): it
is what the test signals and kills. torch's OpenMP pool is not started before the fork (nothing computes in the
zygote), so the children are not at risk of a forked, locked pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_ZYGOTE = r"""
import json, os, signal, sys, warnings
warnings.simplefilter("ignore")
PRELOAD
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            os.chdir(req["cwd"])
            os.environ.update(req["env"])
            sys.argv = ["alignflow", *req["argv"]]
            signal.signal(signal.SIGINT, signal.default_int_handler)
            from alignflow.cli import main
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            EXIT(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print(json.dumps({"exit": code}), flush=True)
"""


@dataclass(frozen=True)
class Finished:
    """How one command ended: its exit status (negative: killed by that signal), stdout and stderr."""

    code: int
    stdout: str
    stderr: str
    seconds: float


# the slow imports of the writing commands (issue 33's tests), once
WRITERS = """\
import torch, safetensors.torch, pandas, tensorboard.summary, mlflow.tracking
import alignflow.cli, alignflow.convert, alignflow.export, alignflow.fingerprint, alignflow.store
"""


class Zygote:
    """The forking process; `start(argv)` -> a running command, `wait()` -> how it ended.

    `preload` is the Python that imports what the commands will need (it must start no thread: the children are
    forked from it). A child leaves with `os._exit`, or with `exit_like_a_process` through the interpreter's own
    exit (threads joined, atexit handlers run: what a command that talks to a Prefect server does as it ends).
    """

    def __init__(self, env: dict[str, str], scratch: Path, preload: str = WRITERS, *,
                 exit_like_a_process: bool = False) -> None:
        self.scratch = scratch
        script = _ZYGOTE.replace("PRELOAD", preload).replace("EXIT", "sys.exit" if exit_like_a_process else "os._exit")
        self.proc = subprocess.Popen([sys.executable, "-c", script],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.n = 0

    def start(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> Running:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.n += 1
        out, err = self.scratch / f"{self.n}.out", self.scratch / f"{self.n}.err"
        self.proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "env": env or {}, "stdout": str(out),
                                          "stderr": str(err)}) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        return Running(self, pid, out, err, time.monotonic())

    def run(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> Finished:
        return self.start(argv, cwd=cwd, env=env).wait()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Running:
    zygote: Zygote
    pid: int
    out: Path
    err: Path
    started: float

    def alive(self) -> bool:
        """Whether the command is still running (the zygote reaps its children at once: an ended one has no pid)."""
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state != "Z"

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it had ended
            if signum == signal.SIGKILL:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)

    def wait(self) -> Finished:
        stdout = self.zygote.proc.stdout
        assert stdout is not None
        code = json.loads(stdout.readline())["exit"]
        return Finished(code, self.out.read_text(errors="replace"), self.err.read_text(errors="replace"),
                        time.monotonic() - self.started)
