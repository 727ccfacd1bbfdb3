"""The journeys' user: a fresh home, a checkout, the documented commands run with bash, Chromium to look.

What a journey sets is what a new user has: `HOME` (a new, empty directory), `PATH` with the environment's `bin`
first (the README's commands are typed with `.venv/bin` on the PATH, or after `source .venv/bin/activate`), the
locale, and `OMP_NUM_THREADS` (how many threads a process spins: the test machine's business, set for every test
process in tests/conftest.py; it changes no result) and `COLUMNS` (the width of the user's terminal, 120, as the
README's sample output was printed). No `PREFECT_API_URL`, `PREFECT_HOME` or `ALIGNFLOW_*`: the
state dir is the default `./.alignflow` of the checkout, Prefect's server is the one alignflow owns.

The checkout is the repository's `hosts.yaml` and `experiments/demo.yaml` at the depth of the deploy tests (one MoE
layer, 4 + 8 steps instead of 4 layers and 10 + 30: tests/deploy/conftest.py's `write_workspace`), so that the walk
costs a minute of training, not three; every command runs as the docs print it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.journeys.markdown import Block, documents, marked_blocks


def user_env(home: Path) -> dict[str, str]:
    """The environment of a new user's shell (see the module's docstring)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    env = {"HOME": str(home), "PATH": path, "LANG": os.environ.get("LANG", "C.UTF-8"),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "COLUMNS": "120"}
    if os.environ.get("TMPDIR"):
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


def write_checkout(work: Path, repo: Path) -> None:
    """The parts of a checkout the walk reads: hosts.yaml and the demo experiment (at the deploy tests' depth)."""
    (work / "experiments").mkdir(parents=True)
    shutil.copy(repo / "hosts.yaml", work / "hosts.yaml")
    demo = yaml.safe_load((repo / "experiments" / "demo.yaml").read_text())
    demo["model"]["num_layers"] = 1
    demo["model"]["moe"]["layer_freq"] = [1]
    demo["training"].update(base_steps=4, steps=8, lr_warmup_iters=2)
    (work / "experiments" / "demo.yaml").write_text(yaml.safe_dump(demo, sort_keys=False))
    # the "any trainer" section's two demos, as short (their pipelines, not their lengths, are what the walk checks)
    same = yaml.safe_load((repo / "experiments" / "demo-same-format.yaml").read_text())
    same["model"]["num_layers"] = 1
    same["model"]["moe"]["layer_freq"] = [1]
    same["training"].update(base_steps=4, steps=8, lr_warmup_iters=2)
    (work / "experiments" / "demo-same-format.yaml").write_text(yaml.safe_dump(same, sort_keys=False))
    hf = yaml.safe_load((repo / "experiments" / "demo-hf-base.yaml").read_text())
    hf["model"]["num_layers"] = 1
    hf["training"].update(steps=8)
    (work / "experiments" / "demo-hf-base.yaml").write_text(yaml.safe_dump(hf, sort_keys=False))


@dataclass
class Background:
    """A documented command left running (`alignflow serve`), its output in a file."""

    command: str
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def interrupt(self, timeout_s: float = 120) -> int:
        """Ctrl-C, as the user ends it; then whatever is left of its process group is killed."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.wait(30)


@dataclass
class Walk:
    """A user's walk through the docs: their home, their checkout, what the commands printed so far."""

    repo: Path
    home: Path
    work: Path
    env: dict[str, str]
    shots: Path
    blocks: dict[str, Block]
    values: dict[str, str] = field(default_factory=dict)  # placeholders learned on the way (RUN)
    background: list[Background] = field(default_factory=list)
    transcript: list[str] = field(default_factory=list)

    def block(self, name: str) -> Block:
        assert name in self.blocks, f"no markdown block is marked `<!-- journey: {name} -->` in {documents(self.repo)}"
        return self.blocks[name]

    def sh(self, command: str, *, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        """Run one documented command line with bash in the checkout, as the user types it."""
        done = subprocess.run(["bash", "-c", command], cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        self.transcript.append(f"$ {command}\n{done.stdout}{done.stderr}(exit {done.returncode})")
        return done

    def command(self, name: str, index: int, expected: str) -> str:
        """Command `index` of block `name` (placeholders filled), which must be the `expected` command: the walk
        this test takes. A block whose commands changed fails here, naming the file and line."""
        block = self.block(name)
        assert index < len(block.commands), f"{block.where}: the journey expects command {index + 1}: `{expected} ...`"
        command = block.command(index, self.values)
        assert command.split("#")[0].split()[:len(expected.split())] == expected.split(), (
            f"{block.where}: command {index + 1} is {block.commands[index]!r}; the journey expects `{expected} ...`")
        return command

    def run(self, name: str, index: int, expected: str, *, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        """Command `index` of block `name`, run as the user types it."""
        return self.sh(self.command(name, index, expected), timeout_s=timeout_s)

    def start(self, name: str, index: int, expected: str) -> Background:
        """Command `index` of block `name` left running, as in a second terminal."""
        command = self.command(name, index, expected)
        log = self.work.parent / f"{name}-{index}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.work, env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        started = Background(command, popen, log)
        self.background.append(started)
        return started


def wait_for(what: str, check: Any, *, timeout_s: float, every_s: float = 1.0, proc: Background | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(f"`{proc.command}` exited {proc.popen.returncode} while waiting for {what}:\n"
                                 f"{proc.output()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def printed_url(text: str, prefix: str) -> str:
    """The URL on the line that starts with `prefix` (`UI`, `ui:`...)."""
    found = re.search(rf"^{re.escape(prefix)}\s*(https?://\S+)", text, re.M)
    assert found, f"no `{prefix} URL` line in:\n{text}"
    return found.group(1)


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory, repo_root: Path) -> Iterator[Walk]:
    root = tmp_path_factory.mktemp("journey")
    home, work = root / "home", root / "alignflow"
    home.mkdir()
    write_checkout(work, repo_root)
    shots = Path(os.environ.get("ALIGNFLOW_SCREENSHOTS") or root / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    walked = Walk(repo=repo_root, home=home, work=work, env=user_env(home), shots=shots,
                  blocks=marked_blocks(documents(repo_root)))
    try:
        yield walked
    finally:
        for proc in reversed(walked.background):
            proc.interrupt()
        walked.sh("alignflow server stop", timeout_s=120)  # what the docs say ends it
        (root / "transcript.txt").write_text("\n\n".join(walked.transcript))


