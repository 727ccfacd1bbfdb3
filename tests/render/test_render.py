"""`alignflow render EXPERIMENT STEP`: the command, environment and files a step would run, as the run renders them.

The real proof that what it prints is what runs is the H200 run recorded in the README (gpu_train of demo-megatron
executed from `--script`); here the script of a CPU step is executed for real and its output checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.backends.commands import step_command
from alignflow.config import load_experiment, load_hosts
from alignflow.errors import AlignflowError
from alignflow.runner.placeholders import fill_all
from alignflow.step_render import render_step

DEMO_SHA = "97ac764eeadd7a5257ab139acc3469eff6c878ea91fa9d4480f4bddcdec201d1"


def cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300, check=False)


@pytest.mark.integration  # runs `python -m alignflow` as a process
def test_the_twin_command_carries_no_twin_flag_and_its_settings_in_the_environment(
        repo_root: Path, subprocess_env: dict[str, str]) -> None:
    done = cli(["render", "demo", "gpu_train"], subprocess_env, repo_root)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "# not known before the run: {in:data}, {in:megatron_ckpt}, {out}, {python}" in out
    assert f"export ALIGNFLOW_TWIN_DATA_SHA256={DEMO_SHA}" in out
    assert "export ALIGNFLOW_TWIN_MEGATRON_VERSION=0.16" in out
    command = out.rstrip().splitlines()[-1]
    assert command.startswith("'{python}' -m alignflow.twin.torch_train --transformer-impl local ")
    assert "--twin" not in command
    assert "--data-path '{in:data}/demo'" in command


def test_with_a_hosts_file_the_host_python_env_and_staged_data_are_filled(repo_root: Path) -> None:
    inventory = load_hosts(repo_root / "hosts.yaml")
    exp = load_experiment(repo_root / "experiments" / "demo-megatron.yaml", inventory)
    r = render_step(exp, "gpu_train", inventory=inventory, values={"out": "/w/out"})
    cuda = inventory.get("cuda")
    assert r.host is not None
    assert r.host.name == "cuda"
    assert r.host_env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert r.argv[0] == sys.executable  # a local host without `python:` runs the controller's interpreter
    assert r.argv[1:5] == ("-m", "torch.distributed.run", "--nproc_per_node", "1")
    data = f"{cuda.workdir}/inputs/data-{DEMO_SHA[:16]}/demo"
    assert r.argv[r.argv.index("--data-path") + 1] == data
    assert r.argv[r.argv.index("--data-cache-path") + 1] == "/w/out/data_cache"
    assert r.unfilled == ("{in:megatron_ckpt}",)
    # the same argv the runner launches with these values
    template = step_command(exp, "gpu_train", data_sha256=DEMO_SHA).template
    values = {"python": sys.executable, "out": "/w/out", "in:data": f"{cuda.workdir}/inputs/data-{DEMO_SHA[:16]}",
              "in:megatron_ckpt": "{in:megatron_ckpt}"}
    assert list(r.argv) == fill_all(template.argv, values)
    assert r.env == dict(template.env)


@pytest.mark.integration  # runs `python -m alignflow` as a process
def test_the_script_runs_the_step_as_the_transport_would(repo_root: Path, tmp_path: Path,
                                                         subprocess_env: dict[str, str]) -> None:
    from tests.convert.synthetic import read_megatron, source_state, write_mindformers

    bf16 = write_mindformers(tmp_path / "bf16", source_state("twin-moe"))
    out = tmp_path / "out"
    done = cli(["render", "demo-megatron", "convert_megatron", "--hosts", str(repo_root / "hosts.yaml"),
                "--set", f"in:bf16_ckpt={bf16}", "--set", f"out={out}", "--script"], subprocess_env, repo_root)
    assert done.returncode == 0, done.stderr
    script = tmp_path / "step.sh"
    script.write_text(done.stdout)
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=subprocess_env, timeout=600,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert (summary["megatron_version"], summary["flavor"]) == ("0.19", "local")
    assert json.loads((out / "model.json").read_text())["vocab_size"] == 256  # the config file was written first
    keys = read_megatron(out / "megatron")["model"]
    assert any(".mtp_model_layer." in k for k in keys)  # megatron-core 0.19's MTP inner-layer name


def test_steps_without_a_command_and_bad_placeholders_are_refused(repo_root: Path) -> None:
    exp = load_experiment(repo_root / "experiments" / "demo.yaml")
    with pytest.raises(AlignflowError, match="has no command"):
        render_step(exp, "compare")
    with pytest.raises(AlignflowError, match="unknown step"):
        render_step(exp, "gpu_trian")
    with pytest.raises(AlignflowError, match="placeholders are python, out and in:NAME"):
        render_step(exp, "gpu_train", values={"outdir": "/x"})
