"""A lab of fake hosts for the runner's logic: the real planner, executors, recording, cache, walker and store
(SQLite), and real `Transport`s over `alignflow.testing.FakeShell` hosts (`tests/runner/hosts.py`: each a real
directory, its commands answered in this process) whose jobs print real-format training logs and write their
declared outputs — no process is started."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from alignflow.config.hosts import Host
from alignflow.convert.registry import SPEC_DIR
from alignflow.logs.render import megatron_line, mindformers_pynative_line
from alignflow.runner.run import execute_pipeline, start_run
from alignflow.runner.session import RunOptions
from alignflow.runview import RunView
from alignflow.store import Store
from alignflow.transport import JobSpec, Transport
from tests.runner.hosts import DirHost, FakeJob, VirtualClock, dir_transport

TEMPLATE: dict[str, Path] = {}


# A valid 1x1 PNG: what the pipeline tests' compare steps write instead of drawing their curves (see below).
ONE_PIXEL_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c6360f8cfc0f01f0005000201e3a4c3c20000000049454e44ae426082")


@pytest.fixture(autouse=True)
def _undrawn_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline tests check what the runner records and decides, never pictures: their compare steps write a
    1-pixel PNG for each metric and thumbnail instead of drawing it with matplotlib (measured: 40 % of these tests'
    time, most of it text layout). The report files, their names and every other byte are the real ones; the
    drawing itself is tested where pictures are the subject (tests/compare, tests/deploy)."""
    from alignflow.compare import plots
    from alignflow.compare.names import THUMBNAIL_METRICS

    def metric_pngs(comparisons: Any, *, labels: Any) -> dict[str, bytes]:
        metrics: list[str] = []
        for c in comparisons:
            metrics += [m for m in c.metrics if m not in metrics]
        return dict.fromkeys(metrics, ONE_PIXEL_PNG)

    def thumbnail_pngs(c: Any, *, labels: Any) -> dict[str, bytes]:
        return {m: ONE_PIXEL_PNG for m in THUMBNAIL_METRICS if m in c.metrics}

    monkeypatch.setattr(plots, "metric_pngs", metric_pngs)
    monkeypatch.setattr(plots, "thumbnail_pngs", thumbnail_pngs)


def npu_log(steps: int, *, loss: float = 5.0, loaded: bool = False) -> str:
    lines = ["All Network parameters are loaded."] if loaded else []
    lines += [mindformers_pynative_line(s, steps, loss=loss - 0.01 * s, step_time_ms=10, lr=1e-3, grad_norm=1.0,
                                        consumed_samples=4 * s, global_batch_size=4) for s in range(1, steps + 1)]
    return "\n".join(lines) + "\n"


def gpu_log(steps: int, *, loss: float = 5.0) -> str:
    """Megatron >= 0.16 prints iteration 2 as the mean of iterations 1 and 2 (the parser de-averages it)."""
    losses = [loss - 0.01 * s for s in range(1, steps + 1)]
    printed = [losses[0], (losses[0] + losses[1]) / 2, *losses[2:]]
    lines = [" successfully loaded checkpoint from /x [ t 1/1, p 1/1 ] at iteration 0"]
    lines += [megatron_line(s, steps, consumed_samples=4 * s, elapsed_ms=10.0, lr=1e-3, global_batch_size=4,
                            losses={"lm loss": printed[s - 1]}, grad_norm=1.0) for s in range(1, steps + 1)]
    return "\n".join(lines) + "\n"


def twin_job(spec: JobSpec, *, base_steps: int = 4, steps: int = 8) -> FakeJob:
    """What each step's real command produces, in the formats the runner reads."""
    argv = " ".join(spec.argv)
    if "convert bf16" in argv:
        return FakeJob(outputs={"bf16/model.safetensors": b"bf16", "bf16/latest_checkpointed_iteration.txt": "4"})
    if "convert megatron" in argv:
        return FakeJob(outputs={"megatron/latest_checkpointed_iteration.txt": "1",
                                "megatron/iter_0000001/mp_rank_00/model_optim_rng.pt": b"mg"})
    if "torch_train" in argv:
        return FakeJob(stdout=gpu_log(steps))
    if "mindspore_train" in argv:
        if spec.name.endswith("npu_base_train"):
            return FakeJob(stdout=npu_log(base_steps), outputs={"checkpoint/model.safetensors": b"base"})
        return FakeJob(stdout=npu_log(steps, loaded=True))
    return FakeJob(exit_code=2, stderr=f"fake host: no script for {argv}\n")


@dataclass
class FakeLab:
    root: Path
    experiment: Path
    hosts: Path
    state: Path
    store: Store
    script: Callable[[JobSpec], FakeJob] = twin_job
    hosts_of: dict[str, DirHost] = field(default_factory=dict)  # what each host's shell was asked, and its jobs
    fakes: dict[str, Transport] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    clock: VirtualClock = field(default_factory=VirtualClock)

    def transport(self, host: Host) -> Transport:
        """One host per inventory host for the whole lab (its files outlive a run, as a real host's do)."""
        fake = self.fakes.get(host.name)
        if fake is None:
            handler = self.hosts_of[host.name] = DirHost(host, script=lambda spec: self.script(spec))
            fake = self.fakes[host.name] = dir_transport(host, handler, controller=self.controller_transport,
                                                         clock=self.clock)
        return fake

    def controller(self, host: Host) -> Transport:
        """The controller's own files are real (the data, fetched logs, reports), unconfined as the real one's."""
        here = host.model_copy(update={"workdir": "/"})
        return dir_transport(here, DirHost(here), clock=self.clock)

    def controller_transport(self) -> Transport:
        """The other end of a host's `put` and `get`."""
        return self.controller(Host(name="controller", role="controller", transport="local", workdir="/"))

    def start(self, **options: Any) -> str:
        return start_run(self.experiment, self.hosts, store=self.store, state_dir=self.state,
                         options=RunOptions(**options))

    def execute(self, run_id: str, *, workers: int = 4) -> RunView:
        return execute_pipeline(run_id, store=self.store, state_dir=self.state, transport_factory=self.transport,
                                controller=self.controller, events=self.messages.append, workers=workers)

    def run(self, **options: Any) -> RunView:
        return self.execute(self.start(**options))

    def edit(self, **changes: Any) -> None:
        data = yaml.safe_load(self.experiment.read_text())
        for dotted, value in changes.items():
            node = data
            *parents, last = dotted.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = value
        self.experiment.write_text(yaml.safe_dump(data, sort_keys=False))

    def launched(self, host: str) -> list[str]:
        return [spec.name.split("-", 1)[1] for spec in self.hosts_of[host].launched] if host in self.hosts_of else []


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite store, copied for each test (migrating takes longer than the test)."""
    state = tmp_path_factory.mktemp("store-template")
    Store.open(state_dir=state, upgrade=True).close()
    return state / "store.sqlite"


@pytest.fixture
def lab(tmp_path: Path, repo_root: Path, migrated_store: Path) -> Iterator[FakeLab]:
    experiment = tmp_path / "tiny.yaml"
    shutil.copy(repo_root / "tests" / "data" / "flow" / "tiny.yaml", experiment)
    shutil.copy(SPEC_DIR / "twin-moe.yaml", tmp_path / "twin-moe.yaml")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {
        name: {"role": name, "transport": "local", "workdir": str(tmp_path / "hosts" / name)}
        for name in ("ascend", "cpu", "cuda")}}))
    state = tmp_path / "state"
    state.mkdir()
    shutil.copy(migrated_store, state / "store.sqlite")
    store = Store.open(state_dir=state)
    try:
        yield FakeLab(tmp_path, experiment, hosts, state, store)
    finally:
        store.close()
