"""The real-MindFormers CPU lab: the launcher's version check, and `experiments/mindformers-cpu.yaml` end to end
(real MindFormers 2.1.0 PyNative on the NPU side, the PyTorch twin on the GPU side, through `alignflow run`),
whose converted checkpoint then strict-loads into megatron-core.

The end-to-end test skips only when the `mindformers-cpu` extra is not installed (CI installs it); a MindFormers
of another version fails it with the version the lab needs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from alignflow.labs.mindformers_cpu import REQUIRED_MINDFORMERS, launcher

# megatron-core's import chain (the data writer) reaches torch.utils.mkldnn, which warns about
# torch.jit.script_method (torch's own deprecation); everything else stays an error.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def test_another_mindformers_version_is_refused_naming_the_one_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "installed_mindformers", lambda: "2.2.0")
    with pytest.raises(launcher.LabUnavailable, match=r"needs mindformers==2\.1\.0, found 2\.2\.0"):
        launcher.check_mindformers()
    assert launcher.main(["--config", "x.yaml"]) == 2


def test_a_missing_mindformers_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "installed_mindformers", lambda: None)
    with pytest.raises(launcher.LabUnavailable, match="mindformers-cpu` extra"):
        launcher.check_mindformers()


def test_graph_mode_is_not_part_of_the_lab() -> None:
    assert launcher.main(["--config", "x.yaml", "--mode", "0"]) == 2


def _require_lab() -> None:
    version = launcher.installed_mindformers()
    if version is None:
        pytest.skip(f"the mindformers-cpu extra is not installed (the lab needs mindformers=={REQUIRED_MINDFORMERS})")
    if version != REQUIRED_MINDFORMERS:
        pytest.fail(f"the MindFormers CPU lab needs mindformers=={REQUIRED_MINDFORMERS}, found {version}")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_real_mindformers_pipeline_passes_and_its_checkpoint_loads_into_megatron_core(
        tmp_path: Path, repo_root: Path, subprocess_env: dict[str, str], prefect_api_url: str) -> None:
    _require_lab()
    from alignflow.labs.mindformers_cpu.data import DEFAULT_PREFIX, write_indexed

    experiments = tmp_path / "experiments"
    shutil.copytree(repo_root / "experiments" / "templates", experiments / "templates")
    doc = yaml.safe_load((repo_root / "experiments" / "mindformers-cpu.yaml").read_text())
    data_dir = tmp_path / "data"
    write_indexed(data_dir, DEFAULT_PREFIX, tokens=65536, seed=7)  # the experiment pins this data's sha256
    doc["data"]["path"] = str(data_dir)
    (experiments / "mindformers-cpu.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    hosts = {"hosts": {role: {"role": role, "transport": "local", "workdir": str(tmp_path / "hosts" / role)}
                       for role in ("ascend", "cpu", "cuda")}}
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    env = subprocess_env | {"ALIGNFLOW_STATE_DIR": str(tmp_path / "state"), "PREFECT_HOME": str(tmp_path / "prefect"),
                            "PREFECT_API_URL": prefect_api_url}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "alignflow", "run", str(experiments / "mindformers-cpu.yaml"),
                          "--hosts", str(tmp_path / "hosts.yaml")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=1700)
    wall_s = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]  # `alignflow run` exits 0 on PASS only
    assert re.search(r"verdict:? PASS", run.stdout), run.stdout[-2000:]
    print(f"mindformers-cpu pipeline: {wall_s:.0f} s")
    # the NPU side was real MindFormers: its logs have the real trainer's lines, and its reload loaded every weight
    reload_logs = list((tmp_path / "hosts" / "ascend" / "artifacts" / "npu_reload_train").glob("*/train.log"))
    assert reload_logs
    text = reload_logs[0].read_text()
    assert "mindformers/pynative/callback/loss_callback.py:337" in text
    assert "All Network parameters are loaded." in text
    assert "Skipping checkpoint loading" not in text
    # the converted checkpoint strict-loads into megatron-core's GPTModel
    converted = next((tmp_path / "hosts" / "cpu" / "artifacts" / "convert_megatron").glob("*/megatron"))
    check = subprocess.run([sys.executable, str(repo_root / "benchmarks" / "megatron_load_check.py"), str(converted),
                            "--spec", "qwen3", "--json"], env=subprocess_env, capture_output=True, text=True,
                           timeout=600)
    assert check.returncode == 0, check.stderr[-3000:]
    assert json.loads(check.stdout)["ok"]
