"""Every shipped MindFormers config, as alignflow renders it, through MindFormers 2.1.0's own loader and registry.

The levels, as the PyNative trainer (`mindformers.pynative.trainer.Trainer`, what `run_mindformer.py --mode 1` runs)
meets them: `loader` — `TrainConfig.load_from_yaml`, which validates every section against MindFormers' own config
dataclasses and refuses an unknown key in any of them except `model` (`allow_extra`); `model config` — the model
section through `MindFormerRegister.get_instance_from_cfg(..., CONFIG)` after the trainer's own
`patch_pynative_modules()`, as `pynative/trainer/utils.py::_build_model` does. The CPU lab
(`experiments/mindformers-cpu.yaml`) goes on to train for real (tests/lab); the seeds' models do not: MindFormers
2.1.0 registers no `glm5`, `qwen3_5` or `qwen3_5_moe` — their PyNative ports are the seeds' own (docs/recipes/), so
each recipe test names the level it reached and the registry's refusal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from alignflow.backends.commands import step_command
from alignflow.config import load_experiment

pytestmark = pytest.mark.slow  # one MindFormers import (~25 s)
pytest.importorskip("mindformers")

REPO = Path(__file__).resolve().parents[2]
# recipe -> (deepest level reached in MindFormers 2.1.0, model_type the registry must know or refuse)
EXPECTED = {
    "mindformers-cpu": ("model config", "qwen3"),
    "glm52_mini": ("loader", "glm5"),
    "glm52_1b": ("loader", "glm5"),
    "qwen35_dense": ("loader", "qwen3_5"),
    "qwen35_moe": ("loader", "qwen3_5_moe"),
}

PROBE = r"""
import json, sys
from alignflow.labs.mindformers_cpu.launcher import prepare
prepare()
from mindformers.pynative.config.config import TrainConfig
from mindformers.pynative.trainer.trainer import patch_pynative_modules
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
patch_pynative_modules()
for name, path in json.loads(sys.argv[1]).items():
    out = {"name": name, "levels": {}}
    try:
        config = TrainConfig.load_from_yaml(path)
        out["levels"]["loader"] = "ok"
    except Exception as exc:
        out["levels"]["loader"] = f"refused: {type(exc).__name__}: {exc}"
        print(json.dumps(out), flush=True)
        continue
    try:
        model = MindFormerRegister.get_instance_from_cfg(config.model.to_dict(), MindFormerModuleType.CONFIG)
        out["levels"]["model config"] = f"ok: {type(model).__name__}"
    except Exception as exc:
        out["levels"]["model config"] = f"refused: {type(exc).__name__}: {exc}"
    print(json.dumps(out), flush=True)
"""


def _rendered(name: str, dest: Path, edit: dict[str, dict[str, object]] | None = None) -> Path:
    exp = load_experiment(REPO / "experiments" / f"{name}.yaml")
    text = step_command(exp, "npu_reload_train", data_sha256="").template.files["config.yaml"]
    if edit:
        data = yaml.safe_load(text)
        for section, values in edit.items():
            data[section].update(values)
        text = yaml.safe_dump(data, sort_keys=False)
    path = dest / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> dict[str, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("mf-configs")
    files = {name: str(_rendered(name, tmp)) for name in EXPECTED}
    # a typo in a section MindFormers validates must be refused: the check can fail
    (tmp / "typo").mkdir()
    files["typo"] = str(_rendered("glm52_mini", tmp / "typo", {"training": {"max_norms": 1.0}}))
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(files)], capture_output=True, text=True,
                          env=subprocess_env, timeout=900, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r["name"]: r["levels"] for r in map(json.loads, (ln for ln in done.stdout.splitlines()
                                                              if ln.startswith("{")))}


@pytest.mark.parametrize("name", list(EXPECTED), ids=[f"{n}-{EXPECTED[n][0].replace(' ', '-')}" for n in EXPECTED])
def test_rendered_config_reaches_its_level_in_mindformers_2_1_0(walked: dict[str, dict[str, str]], name: str) -> None:
    level, model_type = EXPECTED[name]
    levels = walked[name]
    assert levels["loader"] == "ok", levels
    if level == "model config":
        assert levels["model config"].startswith("ok: "), levels
    else:
        assert levels["model config"] == (f"refused: ValueError: Can't find class type config class name "
                                          f"{model_type} in class registry when use_legacy=False"), levels


def test_mindformers_loader_refuses_a_key_it_does_not_know(walked: dict[str, dict[str, str]]) -> None:
    assert walked["typo"]["loader"].startswith("refused: ValueError: Unknown configuration keys for TrainingConfig: "
                                               "['max_norms']"), walked["typo"]
