"""The committed recipes for real hardware: they validate against hosts.ssh.example.yaml, preflight passes on each
as committed, their conversion spec accepts their model, their criteria are their seed's, and what they render (the
MindFormers YAMLs, the Megatron and MindFormers command lines) matches the reviewed golden files.

Regenerate the golden files after a reviewed change with `ALIGNFLOW_UPDATE_GOLDEN=1 pytest tests/recipes`
(tests/data/golden/README.md), then review the diff like code.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.backends import CommandTemplate, TrainSpec, render_training
from alignflow.backends.commands import data_placeholder, step_command
from alignflow.cli import app
from alignflow.config import load_experiment, validate_file
from alignflow.config.experiment import Experiment
from alignflow.convert.plan import build_plan
from alignflow.convert.registry import load_spec
from alignflow.preflight import check_experiment
from tests.recipes.copies import RECIPES, example_inventory

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "recipes"
UPDATE = os.environ.get("ALIGNFLOW_UPDATE_GOLDEN") == "1"


def recipe(repo_root: Path, name: str) -> Experiment:
    return load_experiment(repo_root / "experiments" / f"{name}.yaml", example_inventory(repo_root))


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_validates_against_the_example_inventory(repo_root: Path, name: str) -> None:
    path = repo_root / "experiments" / f"{name}.yaml"
    assert validate_file(path, example_inventory(repo_root)) == "experiment"
    exp = recipe(repo_root, name)
    assert (exp.npu.kind, exp.gpu.kind) == ("mindformers", "megatron")
    assert exp.hosts == {"ascend": "npu-a", "cpu": "cpu-a", "cuda": "gpu-a"}
    assert exp.resolve_path(exp.npu.template or "").is_file()
    assert exp.gate.enabled is True


def test_cli_validate_passes_on_every_committed_file_with_the_example_inventory(
    repo_root: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(repo_root)
    files = ["hosts.ssh.example.yaml", "nightly.yaml", *(f"experiments/{name}.yaml" for name in RECIPES)]
    result = CliRunner().invoke(app, ["validate", "--hosts", "hosts.ssh.example.yaml", *files])
    assert result.exit_code == 0, result.output
    for name in RECIPES:
        assert f"ok  experiments/{name}.yaml (experiment)" in result.output


@pytest.mark.parametrize("name", RECIPES)
def test_preflight_passes_on_the_recipe_as_committed(repo_root: Path, name: str) -> None:
    report = check_experiment(recipe(repo_root, name), inventory=example_inventory(repo_root))
    assert report.ok, report.summary()
    checked = {f.setting for f in report.findings}
    assert {"det.hccl", "det.nvte", "data.file", "model.vocab_size", "mtp.loss_scale"} <= checked


@pytest.mark.parametrize("name", RECIPES)
def test_the_conversion_spec_accepts_the_recipes_model(repo_root: Path, name: str) -> None:
    exp = recipe(repo_root, name)
    plan = build_plan(load_spec(exp.conversion.spec), exp.model, flavor="te",
                      megatron_version=exp.gpu.megatron_version)
    assert plan.problems == ()
    assert any(".mtp_model_layer." in t for m in plan.mappings for t in m.targets)  # megatron-core >= 0.17 naming


@pytest.mark.parametrize(("name", "criteria"), [
    ("qwen35_dense", {("lm_loss", "step_rel", 0.005), ("lm_loss", "mean_rel", 0.01), ("mtp_1_loss", "step_rel", 0.005),
                      ("mtp_1_loss", "mean_rel", 0.01)}),
    ("qwen35_moe", {("lm_loss", "step_rel", 0.005), ("lm_loss", "mean_rel", 0.01), ("mtp_1_loss", "step_rel", 0.005),
                    ("mtp_1_loss", "mean_rel", 0.01)}),
    ("glm52_mini", {("lm_loss", "me", 0.001), ("grad_norm", "me", 0.01)}),
    ("glm52_1b", {("lm_loss", "me", 0.001), ("grad_norm", "me", 0.01)}),
])
def test_recipe_carries_its_seeds_criteria(repo_root: Path, name: str, criteria: set[tuple[str, str, float]]) -> None:
    exp = recipe(repo_root, name)
    assert {(c.metric, c.statistic, c.threshold) for c in exp.criteria} == criteria
    for c in exp.criteria:
        if c.statistic == "mean_rel":
            # the Adam first-step transient, docs/seeds.md#step-2-outlier-after-the-first-adam-update
            assert c.exclude_steps == [2]
        if c.statistic == "step_rel":
            assert c.steps == [1]


@pytest.mark.parametrize("name", ["qwen35_dense", "qwen35_moe"])
def test_qwen_recipes_state_their_host_prerequisites(repo_root: Path, name: str) -> None:
    text = (repo_root / "experiments" / f"{name}.yaml").read_text()
    exp = recipe(repo_root, name)
    assert exp.gpu.transformer_impl == "transformer_engine"
    # megatron-core 0.16-0.19 build MTP + GatedDeltaNet without the report's patch (tests/recipes/test_megatron_core.py)
    assert "no MTP+GDN patch on megatron-core 0.16-0.19" in " ".join(exp.description.split())
    assert "TE" in exp.description
    assert "docs/seeds.md#mtp-and-gateddeltanet-patch" in text  # where the patch is described
    assert "docs/recipes/qwen35.md" in text  # what was and was not proven


def _shell(template: CommandTemplate) -> str:
    """A command as a reviewer reads it: the environment, then one flag (with its values) per line."""
    lines = [f"{k}={shlex.quote(v)} \\" for k, v in template.env.items()]
    groups: list[list[str]] = []
    for token in template.argv:
        if token.startswith("--") or token.endswith(".py") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    lines += [" ".join(shlex.quote(t) for t in g) + " \\" for g in groups]
    lines[-1] = lines[-1].removesuffix(" \\")
    return "\n".join(lines) + "\n"


def rendered_files(exp: Experiment) -> dict[str, str]:
    """What alignflow renders for a recipe, placeholders unfilled (host-independent)."""
    out = {}
    for step in ("npu_base_train", "npu_reload_train", "gpu_train"):
        template = step_command(exp, step, data_sha256="").template
        out[f"{step}.sh"] = _shell(template)
        if "config.yaml" in template.files:
            out[f"{step}.config.yaml"] = template.files["config.yaml"]
    gate = TrainSpec("early_gate", "gpu", exp.gate.steps, data_placeholder(exp), "", "{in:megatron_ckpt}", None)
    out["early_gate.gpu.sh"] = _shell(render_training(exp, gate))
    return out


@pytest.mark.parametrize("name", RECIPES)
def test_rendered_commands_and_configs_match_the_reviewed_golden_files(repo_root: Path, name: str) -> None:
    files = rendered_files(recipe(repo_root, name))
    folder = GOLDEN / name
    if UPDATE:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in set(p.name for p in folder.iterdir()) - set(files):
            (folder / stale).unlink()
        for rel, text in files.items():
            (folder / rel).write_text(text, encoding="utf-8")
    assert sorted(p.name for p in folder.iterdir()) == sorted(files), "golden files missing or stale"
    for rel, text in files.items():
        assert text == (folder / rel).read_text(encoding="utf-8"), f"{name}/{rel} differs from the golden file"
