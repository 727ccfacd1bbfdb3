"""A MindFormers run whose checkpoint did not load fails its step: the `mindformers` backend's reload command,
read by the runner's own log check, on real MindFormers 2.1.0 logs (tests/data/mindformers_2.1.0, from the lab).

Real MindFormers exits 0 in both cases: with `Checkpoint path does not exist: ... Skipping checkpoint loading,
model will use random initialization.` and with `Network parameters not loaded:` (a checkpoint lacking a
tensor; logged at INFO). Only the log tells.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from alignflow.backends.commands import step_command
from alignflow.config.experiment import load_experiment
from alignflow.config.hosts import load_hosts
from alignflow.errors import SentinelError
from alignflow.runner.engine import StepRunner
from tests.runner.hosts import on_disk

REAL = Path(__file__).resolve().parents[1] / "data" / "mindformers_2.1.0"


@pytest.fixture
def reload_check(repo_root: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    experiment = load_experiment(repo_root / "experiments" / "mindformers-cpu.yaml")
    template = step_command(experiment, "npu_reload_train", data_sha256="0" * 64).template
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  ascend: {{role: ascend, transport: local, workdir: {tmp_path / 'wd'}}}\n")
    inventory = load_hosts(hosts)
    # the runner's own log check (StepRunner.read_log reads only the run's id and state dir of the runner)
    runner = SimpleNamespace(run_id="r1", state_dir=tmp_path)
    transport = on_disk(inventory.hosts["ascend"])
    (tmp_path / "wd").mkdir()

    def check(log: str) -> None:
        shutil.copy(REAL / log, tmp_path / "wd" / log)
        StepRunner.read_log(runner, "npu_reload_train", transport, str(tmp_path / "wd" / log),  # type: ignore[arg-type]
                            template, log)

    return check


def test_the_reload_command_is_the_real_backend_s(repo_root: Path) -> None:
    experiment = load_experiment(repo_root / "experiments" / "mindformers-cpu.yaml")
    template = step_command(experiment, "npu_reload_train", data_sha256="0" * 64).template
    assert template.argv[1:3] == ("-m", "alignflow.labs.mindformers_cpu.launcher")
    assert "All Network parameters are loaded." in template.required_lines


def test_a_good_reload_log_passes(reload_check) -> None:  # type: ignore[no-untyped-def]
    reload_check("reload.log")


@pytest.mark.parametrize(("log", "says"), [("missing_checkpoint.log", "Skipping checkpoint loading"),
                                           ("missing_parameter.log", "output_layer.weight")])
def test_a_reload_that_did_not_load_its_checkpoint_fails_the_step(reload_check, log: str, says: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SentinelError, match=says):
        reload_check(log)
