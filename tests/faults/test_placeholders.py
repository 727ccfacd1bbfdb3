"""Issue 16, item 10: host paths are quoted for the format they are filled into, and a failed job's own error
line is in the step error.

A workdir holding `'` used to turn the NPU side's rendered `config.yaml` into malformed YAML (`config.yaml:13`)
and the step error said only `exited(1)`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alignflow import pipeline
from alignflow.backends.commands import step_command
from alignflow.config import load_experiment
from alignflow.errors import RemoteJobError
from alignflow.logs.render import mindformers_pynative_line
from alignflow.runner.engine import StepRunner
from alignflow.runner.jobstep import run_job_step
from alignflow.runner.placeholders import fill, fill_all
from alignflow.runner.run import data_artifact, start_run
from alignflow.runner.session import open_run
from alignflow.store import Store
from alignflow.transport import open_transport
from tests.flows.conftest import make_flow_env

pytestmark = pytest.mark.integration

HOSTILE_DIRS = [
    "/data/it's here",
    '/data/say "hi"',
    "/data/key: value # not a comment",
    "/data/{a: 1}, [b]",
    "/data/back\\slash\\n",
    "/data/new\nline",
    "/data/tab\tand\u2028separator",
    "/data/ünïcödé 数据 🙂",
    "/data/- dash & *star !tag %pct @at `tick`",
]


def _values(base: str) -> dict[str, str]:
    return {"python": "/usr/bin/python3", "out": f"{base}/out", "in:data": f"{base}/inputs/data",
            "in:bf16_ckpt": f"{base}/inputs/bf16"}


@pytest.mark.parametrize("base", HOSTILE_DIRS)
def test_the_twins_npu_config_parses_back_to_the_exact_host_paths(repo_root: Path, base: str, tmp_path: Path
                                                                  ) -> None:
    from alignflow.twin.mindformers_yaml import load_mindformers_config

    experiment = load_experiment(repo_root / "tests" / "data" / "flow" / "tiny.yaml")
    for step, key in (("npu_base_train", "save_path"), ("npu_reload_train", "load_path")):
        template = step_command(experiment, step, data_sha256="0" * 64).template
        path = tmp_path / f"{step}.yaml"
        path.write_text(fill(template.files["config.yaml"], _values(base)), encoding="utf-8")
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        expected = f"{base}/out/checkpoint" if step == "npu_base_train" else f"{base}/inputs/bf16"
        assert raw["checkpoint"][key] == expected
        # the indexed dataset's prefix inside the staged data directory
        data_path = raw["train_dataset"]["dataloader"]["config"]["data_path"][1]
        assert data_path == f"{base}/inputs/data/{experiment.data.prefix}"
        load_mindformers_config(path)  # the twin's own reader accepts it


@pytest.mark.parametrize("base", HOSTILE_DIRS[:4])
def test_the_mindformers_config_parses_back_to_the_exact_host_paths(repo_root: Path, base: str) -> None:
    experiment = load_experiment(repo_root / "experiments" / "qwen35_dense.yaml")
    template = step_command(experiment, "npu_reload_train", data_sha256="0" * 64).template
    config = yaml.safe_load(fill(template.files["config.yaml"], _values(base)))
    assert config["checkpoint"]["load_path"] == f"{base}/inputs/bf16"
    assert config["train_dataset"]["dataloader"]["config"]["data_path"][1].startswith(f"{base}/inputs/data/")


def test_values_in_a_shell_script_of_a_command_template_are_one_word_each(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "it's \"odd\" $HOME `x` ; touch PWNED"
    out.mkdir()
    argv = fill_all(["bash", "-c", "printf %s {out} > {out}/where.txt"], {"out": str(out)})
    subprocess.run(argv, check=True, cwd=tmp_path)
    assert (out / "where.txt").read_text() == str(out)
    assert not list(tmp_path.rglob("PWNED"))


def _env(tmp_path: Path, repo_root: Path, workdir_name: str, command: list[str]) -> tuple[object, Path]:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {
        "ascend": {"role": "ascend", "transport": "local", "workdir": f"hosts/{workdir_name}/ascend"},
        "cpu": {"role": "cpu", "transport": "local", "workdir": "hosts/cpu"},
        "cuda": {"role": "cuda", "transport": "local", "workdir": "hosts/cuda"},
    }}))
    env = make_flow_env(tmp_path, repo_root, hosts=hosts)
    log = tmp_path / "base.log"
    log.write_text("".join(mindformers_pynative_line(s, 4, loss=5.0, step_time_ms=1, lr=1e-3, grad_norm=1.0,
                                                     consumed_samples=4 * s, global_batch_size=4) + "\n"
                           for s in range(1, 5)))
    exp = yaml.safe_load(env.experiment.read_text())
    exp["steps"] = {"npu_base_train": {"command": [*command[:-1], command[-1].replace("LOG", str(log))]}}
    env.experiment.write_text(yaml.safe_dump(exp, sort_keys=False))
    return env, log


def _execute(env: object) -> tuple[object, str]:
    with Store.open(state_dir=env.state) as store:  # type: ignore[attr-defined]
        run_id = start_run(env.experiment, env.hosts, store=store, state_dir=env.state)  # type: ignore[attr-defined]
        ctx = open_run(store, run_id)
        runner = StepRunner(ctx, store=store, state_dir=env.state,  # type: ignore[attr-defined]
                            transport_factory=open_transport)
        try:
            data = data_artifact(ctx, state_dir=env.state)  # type: ignore[attr-defined]
            return run_job_step(runner, pipeline.DEFAULT.step("npu_base_train"), {"data": data}), run_id
        finally:
            runner.close()


def test_a_step_in_a_workdir_with_quotes_and_dollars_runs_its_shell_template(
        tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(repo_root))
    script = ("mkdir -p {out}/checkpoint && echo 4 > {out}/checkpoint/latest_checkpointed_iteration.txt"
              " && test -d {in:data} && cat LOG")  # the data: an indexed dataset's directory
    env, _ = _env(tmp_path, repo_root, "it's \"q\" $HOME `x`", ["bash", "-c", script])
    outcome, _ = _execute(env)
    assert outcome.status == "ran"  # type: ignore[attr-defined]


def test_a_failed_step_says_the_jobs_own_error_line(tmp_path: Path, repo_root: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """MindFormers (and the twin) log their errors on stdout: the step error must show that line."""
    monkeypatch.setenv("PYTHONPATH", str(repo_root))
    line = "2026-01-01 10:00:00,000 - mindformers[run_mindformer.py:42] - ERROR - config.yaml:13: bad indentation"
    env, _ = _env(tmp_path, repo_root, "plain", ["bash", "-c", f"echo starting; echo '{line}'; exit 1 # LOG"])
    with pytest.raises(RemoteJobError) as info:
        _execute(env)
    assert "exited(1)" in str(info.value)
    assert "config.yaml:13: bad indentation" in str(info.value).splitlines()[0]
