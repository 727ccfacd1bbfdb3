"""Issue 33: `kill -9` and Ctrl-C of the commands that write (`convert bf16`, `convert megatron`, `hash`, `export`).

Afterwards the result is whole or absent, never half there; the next command succeeds; what a killed writer left
beside its destination is removed by the next write there or by `alignflow gc`, only once its process is dead.

The property test interrupts each command at random points (SIGKILL and SIGINT, `ALIGNFLOW_INTERRUPT_SEEDS` seeds,
default 3): the delay is drawn uniformly over how long the uninterrupted command took, so that points fall in its
start, its write and its end. Each command is a real process forked from one that imported alignflow once
(tests/faults/forked_cli.py): the point is where the write is, not the imports. It prints its figures: how many
interruptions, how many landed while the staging directory existed (mid-write), how many after the command ended.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from alignflow.staging import MARKER, staging_destination
from tests.faults.forked_cli import Finished, Zygote

pytestmark = pytest.mark.integration

SEEDS = int(os.environ.get("ALIGNFLOW_INTERRUPT_SEEDS", "3"))
# twin-dense with a vocabulary and width that make the checkpoints ~22 MB in bf16 (44 MB in float32 for the base):
# the conversions still spend most of their run inside the write (the test prints how many interruptions landed
# there), and each interruption and its next command cost a quarter of the 90 MB model's.
MODEL = """\
family: twin-dense
num_layers: 4
hidden_size: 256
ffn_hidden_size: 512
num_attention_heads: 4
num_query_groups: 2
kv_channels: 64
vocab_size: 16384
seq_length: 32
rotary_base: 10000
norm_epsilon: 1.0e-5
mtp: {num_layers: 1, loss_scaling_factor: 0.3}
"""
EXPORT_STEPS = 300  # per side: ~8,000 TensorBoard scalars (its writer takes ~0.2 ms each), 2 MLflow batches a run


def staging_in(directory: Path) -> list[str]:
    """Staging directories (`.<name>.<8>.partial`) in `directory`."""
    return sorted(p.name for p in directory.iterdir() if staging_destination(p.name) is not None)


@dataclass
class Bench:
    """The inputs, references and the forking process shared by the module's tests."""

    root: Path
    zygote: Zygote
    env: dict[str, str]
    base: Path
    bf16: Path
    digests: dict[str, str]  # reference sha256 of each command's complete output
    run_id: str = ""
    store_url: str = ""
    mlflow_template: Path | None = None
    durations: dict[str, float] = field(default_factory=dict)

    def fresh(self, name: str) -> Path:
        d = self.root / "cases" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def sha(self, path: Path) -> str:
        from alignflow.fingerprint import fingerprint

        return fingerprint(path).sha256


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> Iterator[Bench]:
    import torch

    from alignflow.config.model import ModelConfig
    from alignflow.config.yamlsource import load_yaml, validate
    from tests.convert.synthetic import source_state, write_mindformers
    from tests.recorded_run import record_run

    root = tmp_path_factory.mktemp("interrupt")
    (root / "model.yaml").write_text(MODEL)
    model = validate(ModelConfig, load_yaml(root / "model.yaml"))
    base = write_mindformers(root / "base", source_state("twin-dense", model, dtype=torch.float32))
    recorded = record_run(root / "run", steps=EXPORT_STEPS)
    env = {**subprocess_env, "ALIGNFLOW_HASH_MEMO": str(root / "memo.sqlite"), "ALIGNFLOW_DB_URL": recorded.url}
    (root / "zygote").mkdir()
    zygote = Zygote(env, root / "zygote")
    b = Bench(root, zygote, env, base, root / "bf16", {}, recorded.run_id, recorded.url)
    try:
        for case in CASES.values():
            if case.name == "export-mlflow":
                b.mlflow_template = root / "mlflow-template.db"
                from mlflow.tracking import MlflowClient  # the schema's Alembic migrations, once

                MlflowClient(tracking_uri=f"sqlite:///{b.mlflow_template}").search_experiments()
            where = b.fresh(f"reference-{case.name}")
            case.prepare(b, where)
            done = zygote.run(case.argv(b, where, "out"), cwd=where, env=case.env(where))
            assert done.code == 0, done.stderr
            b.durations[case.name] = done.seconds
            b.digests[case.name] = case.digest(b, where, "out", done)
            if case.name == "convert-bf16":
                shutil.copytree(where / "out", b.bf16)
        yield b
    finally:
        zygote.close()


@dataclass(frozen=True)
class Case:
    """One writing command: its argv for a destination name, and how to read back what it produced."""

    name: str
    argv: Callable[[Bench, Path, str], list[str]]
    digest: Callable[[Bench, Path, str, Finished], str]  # "" when nothing of it exists
    staging_dir: Callable[[Path], Path]  # where its staging appears
    prepare: Callable[[Bench, Path], None] = lambda b, where: None
    env: Callable[[Path], dict[str, str]] = lambda where: {}


def _tree(b: Bench, where: Path, name: str, done: Finished) -> str:
    path = where / name
    return b.sha(path) if path.exists() else ""


def _tb(b: Bench, where: Path, name: str, done: Finished) -> str:
    """The export's TensorBoard runs (one per side and the error) with their scalars, as (run, tag, step count):
    "" when the run directory does not exist."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = where / name / b.run_id
    if not run.exists():
        return ""
    found = []
    for side in sorted(p for p in run.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(side), size_guidance={"tensors": 0})
        acc.Reload()
        found += [(side.name, tag, len(acc.Tensors(tag))) for tag in acc.Tags()["tensors"]]
    return repr(sorted(found))


def _mlflow_db(where: Path) -> Path:
    return where / "mlflow.db"


def _mlflow(b: Bench, where: Path, name: str, done: Finished) -> str:
    """The run's MLflow export: each active run's side, state and metric counts; "" when none is there."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{_mlflow_db(where)}")
    runs = [r for e in client.search_experiments() for r in client.search_runs(
        [e.experiment_id], filter_string=f"tags.`alignflow.run_id` = '{b.run_id}'")]
    return repr(sorted((r.data.tags.get("alignflow.side", "run"), r.data.tags.get("alignflow.export_state"),
                        r.info.status,
                        sorted((k, len(client.get_metric_history(r.info.run_id, k))) for k in r.data.metrics))
                       for r in runs)) if runs else ""


def _hash(b: Bench, where: Path, name: str, done: Finished) -> str:
    return done.stdout


CASES: dict[str, Case] = {c.name: c for c in (
    Case("convert-bf16", lambda b, w, n: ["convert", "bf16", str(b.base), str(w / n)], _tree, lambda w: w),
    Case("convert-megatron", lambda b, w, n: ["convert", "megatron", str(b.bf16), str(w / n), "--spec", "twin-dense",
                                               "--model", str(b.root / "model.yaml")], _tree, lambda w: w),
    # a memo of its own per case: the command reads every byte and writes its memo, which a kill may interrupt
    Case("hash", lambda b, w, n: ["hash", str(b.base)], _hash, lambda w: w,
         env=lambda w: {"ALIGNFLOW_HASH_MEMO": str(w / "memo.sqlite")}),
    Case("export-tensorboard", lambda b, w, n: ["export", b.run_id[:8], "--tensorboard", str(w / n)], _tb,
         lambda w: w / "out"),
    Case("export-mlflow", lambda b, w, n: ["export", b.run_id[:8], "--mlflow", "--mlflow-uri",
                                            f"sqlite:///{_mlflow_db(w)}"],
         _mlflow, lambda w: w,
         prepare=lambda b, w: shutil.copy(b.mlflow_template or "", _mlflow_db(w))),
)}


def _next_destination(case: Case, b: Bench, where: Path, first: str) -> str:
    """The next command's destination: the same when nothing is there, a fresh one beside a complete result."""
    if case.name in ("hash", "export-mlflow"):
        return first  # hash writes no output file; an MLflow export of a complete run is refused, checked apart
    result = where / first / b.run_id if case.name == "export-tensorboard" else where / first
    return first if not result.exists() else "again"


@dataclass
class Figures:
    interruptions: int = 0
    mid_write: int = 0
    after_end: int = 0
    leftovers_seen: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


def _interrupt_once(b: Bench, case: Case, signum: int, rng: random.Random, figures: Figures, tag: str) -> None:
    where = b.fresh(tag)
    case.prepare(b, where)
    delay = rng.uniform(0.0, 1.1 * b.durations[case.name])
    running = b.zygote.start(case.argv(b, where, "out"), cwd=where, env=case.env(where))
    time.sleep(max(0.0, delay - (time.monotonic() - running.started)))
    parent = case.staging_dir(where)
    mid = parent.exists() and bool(staging_in(parent))
    running.signal(signum)
    done = running.wait()
    figures.interruptions += 1
    figures.mid_write += mid
    figures.after_end += done.code == 0
    outcome = f"{case.name} {signal.Signals(signum).name} -> {done.code}"
    figures.by_outcome[outcome] = figures.by_outcome.get(outcome, 0) + 1
    what = f"{tag}: {case.name} {signal.Signals(signum).name} after {delay:.2f}s (exit {done.code})"
    assert "Traceback" not in done.stderr, f"{what}\n{done.stderr}"
    got = case.digest(b, where, "out", done)
    if case.name == "export-mlflow" and signum == signal.SIGKILL and "'partial'" in got:
        figures.leftovers_seen += 1  # a killed export's runs: the next one deletes them
    else:
        assert got in ("", b.digests[case.name]), f"{what}: a partial result\n{got[:400]}"
    if signum == signal.SIGINT:
        assert done.code in (0, 130), f"{what}\n{done.stderr}"
        assert (got == b.digests[case.name]) == (done.code == 0), f"{what}: exit {done.code} but output {bool(got)}"
        assert not (parent.exists() and staging_in(parent)), f"{what}: Ctrl-C left staging"
    else:
        assert done.code in (0, -signal.SIGKILL), f"{what}\n{done.stderr}"
        if got == b.digests[case.name]:
            assert case.name == "hash" or done.code in (0, -signal.SIGKILL)
    figures.leftovers_seen += bool(parent.exists() and staging_in(parent))
    # the next command succeeds and leaves no staging behind
    nxt = _next_destination(case, b, where, "out")
    if case.name == "export-mlflow" and got == b.digests[case.name]:
        refused = b.zygote.run(case.argv(b, where, nxt), cwd=where, env=case.env(where))
        assert refused.code == 1, refused.stderr
        assert "already exported" in refused.stderr
        return
    again = b.zygote.run(case.argv(b, where, nxt), cwd=where, env=case.env(where))
    assert again.code == 0, f"{what}: the next command failed\n{again.stderr}"
    assert case.digest(b, where, nxt, again) == b.digests[case.name], what
    assert not (parent.exists() and staging_in(parent)), f"{what}: staging left after the next command"


@pytest.mark.slow  # ~2 s per interruption and its next command: 5 commands x 2 signals x SEEDS
def test_kill_and_ctrl_c_at_random_points_leave_the_whole_result_or_none(bench: Bench) -> None:
    figures = Figures()
    start = time.monotonic()
    for seed in range(SEEDS):
        rng = random.Random(seed)
        for case in CASES.values():
            for signum in (signal.SIGKILL, signal.SIGINT):
                _interrupt_once(bench, case, signum, rng, figures, f"s{seed}-{case.name}-{signum}")
    elapsed = time.monotonic() - start
    print(f"\ninterruptions: {SEEDS} seeds x {len(CASES)} commands x 2 signals = {figures.interruptions} in "
          f"{elapsed:.0f} s; {figures.mid_write} landed while a staging directory existed (mid-write), "
          f"{figures.after_end} after the command had completed; {figures.leftovers_seen} left staging or partial "
          f"runs that the next command removed")
    for outcome, n in sorted(figures.by_outcome.items()):
        print(f"  {outcome}: {n}")
    print("  uninterrupted durations: " + ", ".join(f"{k} {v:.2f}s" for k, v in bench.durations.items()))
    assert figures.mid_write > 0  # the points reach the writes, not only the start


def _writing(directory: Path) -> bool:
    """A staging directory in `directory` holds something its writer wrote (beyond its owner marker)."""
    return any(p.is_file() and p.name != MARKER for s in staging_in(directory) for p in (directory / s).rglob("*"))


def _kill_when_staging(b: Bench, case: Case, where: Path, name: str = "out") -> Finished:
    running = b.zygote.start(case.argv(b, where, name), cwd=where)
    assert _wait_for(lambda: _writing(case.staging_dir(where))), "the command never wrote into its staging"
    running.signal(signal.SIGKILL)
    return running.wait()


def test_a_killed_megatron_conversion_is_removed_by_a_write_beside_it(bench: Bench) -> None:
    """The issue's case: `.<dst>.<random>.partial` of a conversion killed mid-write; a conversion to another
    destination in the same directory removes it (its writer is dead), and converts."""
    case = CASES["convert-megatron"]
    where = bench.fresh("beside")
    done = _kill_when_staging(bench, case, where)
    assert done.code == -signal.SIGKILL
    (left,) = staging_in(where)
    assert left.startswith(".out.")
    assert (where / left / MARKER).is_file()  # killed in the middle of the write, not at its birth
    again = bench.zygote.run(case.argv(bench, where, "other"), cwd=where)
    assert again.code == 0, again.stderr
    assert sorted(p.name for p in where.iterdir()) == ["other"]


def test_gc_lists_and_deletes_what_a_killed_conversion_left(bench: Bench, subprocess_env: dict[str, str]) -> None:
    case = CASES["convert-bf16"]
    where = bench.fresh("gc")
    assert _kill_when_staging(bench, case, where).code == -signal.SIGKILL
    (left,) = staging_in(where)

    def gc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "alignflow", "gc", str(where), *args], capture_output=True,
                              text=True, env=subprocess_env, timeout=300)

    listed = gc("--json")
    assert listed.returncode == 0, listed.stderr
    assert f"{where / left}" in listed.stdout
    assert "convert bf16 (pid" in listed.stdout
    assert "is dead" in listed.stdout
    assert staging_in(where) == [left]  # a dry run
    deleted = gc("--delete")
    assert deleted.returncode == 0, deleted.stderr
    assert staging_in(where) == []
    assert "deleted 1 items" in deleted.stdout


def test_a_running_conversion_is_never_collected(bench: Bench, subprocess_env: dict[str, str]) -> None:
    """gc beside a live conversion: its staging directory is held (flock) and its owner alive, so it stays."""
    case = CASES["convert-bf16"]
    where = bench.fresh("live")
    running = bench.zygote.start(case.argv(bench, where, "out"), cwd=where)
    assert _wait_for(lambda: _writing(where)), "the conversion never wrote into its staging"
    os.kill(running.pid, signal.SIGSTOP)
    try:
        listed = subprocess.run([sys.executable, "-m", "alignflow", "gc", str(where), "--delete", "--json"],
                                capture_output=True, text=True, env=subprocess_env, timeout=300)
        assert listed.returncode == 0, listed.stderr
        assert '"deleted": []' in listed.stdout
        assert staging_in(where)
    finally:
        os.kill(running.pid, signal.SIGCONT)
    assert running.wait().code == 0
    assert sorted(p.name for p in where.iterdir()) == ["out"]


def _wait_for(condition: Callable[[], bool], timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True
