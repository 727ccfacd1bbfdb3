"""`steps.<name>` of an experiment: the step names and declared outputs come from the pipeline's declarations."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow import pipeline
from alignflow.config import load_experiment
from alignflow.errors import ConfigError


def _write(repo_root: Path, tmp_path: Path, steps: str) -> Path:
    text = (repo_root / "experiments" / "demo.yaml").read_text()
    assert "conversion:\n" in text
    path = tmp_path / "exp.yaml"
    path.write_text(text.replace("conversion:\n", f"steps:\n{steps}conversion:\n", 1))
    return path


def test_declared_outputs_of_a_step_are_its_pipeline_outputs(repo_root: Path, tmp_path: Path) -> None:
    ok = load_experiment(_write(repo_root, tmp_path, "  convert_bf16: {outputs: [bf16_ckpt]}\n"))
    assert ok.steps["convert_bf16"].outputs == ["bf16_ckpt"]
    with pytest.raises(ConfigError) as info:
        load_experiment(_write(repo_root, tmp_path, "  convert_bf16: {outputs: [bf16_ckpt, gpu_log]}\n"))
    assert "steps.convert_bf16.outputs: gpu_log not produced by convert_bf16 (it produces bf16_ckpt)" in str(info.value)


def test_every_pipeline_step_may_be_configured(repo_root: Path, tmp_path: Path) -> None:
    # one list of step names (the pipeline's): the optional early gate included
    ok = load_experiment(_write(repo_root, tmp_path, "  early_gate: {timeout_s: 60}\n"))
    assert ok.steps["early_gate"].timeout_s == 60
    with pytest.raises(ConfigError) as info:
        load_experiment(_write(repo_root, tmp_path, "  gpu_trian: {timeout_s: 5}\n"))
    assert f"steps are: {', '.join(pipeline.STEP_NAMES)}" in str(info.value)
