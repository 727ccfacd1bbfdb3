"""`alignflow convert ...`: exit 0 converted, 1 conversion problems (all listed), 2 bad arguments; --json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from alignflow.cli import app

from .synthetic import source_state, write_mindformers

runner = CliRunner()


@pytest.fixture
def bf16_dir(tmp_path):
    write_mindformers(tmp_path / "base", source_state("twin-moe-bias"))
    result = runner.invoke(app, ["convert", "bf16", str(tmp_path / "base"), str(tmp_path / "bf16")])
    assert result.exit_code == 0, result.output
    return tmp_path / "bf16"


def test_bf16_megatron_and_back_with_json_summaries(tmp_path, bf16_dir):
    mg = runner.invoke(app, ["convert", "megatron", str(bf16_dir), str(tmp_path / "mg"), "--spec", "twin-moe-bias",
                             "--flavor", "te", "--megatron-version", "0.19.2", "--iteration", "3", "--json"])
    assert mg.exit_code == 0, mg.output
    summary = json.loads(mg.stdout)
    assert summary["kind"] == "megatron"
    assert summary["tensors"] == 81
    assert summary["extra_state_keys"] == 42  # 34 TE linears and attention + 8 TENorms
    assert summary["output_files"] == ["latest_checkpointed_iteration.txt",
                                       "iter_0000003/mp_rank_00/model_optim_rng.pt"]
    assert summary["megatron_version"] == "0.19.2"
    assert summary["flavor"] == "te"
    back = runner.invoke(app, ["convert", "mindformers", str(tmp_path / "mg"), str(tmp_path / "back"), "--spec",
                               "twin-moe-bias", "--flavor", "te", "--megatron-version", "0.19", "--json"])
    assert back.exit_code == 0, back.output
    assert json.loads(back.stdout)["iteration"] == 3
    assert (tmp_path / "back/iteration_00000003/checkpoint-model-0000000-0000001.safetensors").is_file()


def test_conversion_problems_exit_1_with_every_key(tmp_path, bf16_dir):
    result = runner.invoke(app, ["convert", "megatron", str(bf16_dir), str(tmp_path / "mg"), "--spec", "twin-moe"])
    assert result.exit_code == 1
    for layer in ("decoder.layers.1.", "decoder.layers.2.", "decoder.layers.3.", "mtp.layers.0.transformer_layer."):
        assert f"unused MindFormers key '{layer}mlp.expert_bias'" in result.stderr
    assert not (tmp_path / "mg").exists()


@pytest.mark.parametrize("args", [
    ["--spec", "no-such-spec"],
    ["--spec", "qwen35-dense", "--flavor", "local"],
    ["--spec", "twin-moe", "--flavor", "fast"],
    ["--spec", "twin-moe", "--megatron-version", "latest"],
    ["--spec", "twin-moe", "--iteration", "-1"],
])
def test_bad_arguments_exit_2(tmp_path, bf16_dir, args):
    result = runner.invoke(app, ["convert", "megatron", str(bf16_dir), str(tmp_path / "mg"), *args])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "mg").exists()


def test_specs_lists_every_spec(tmp_path):
    result = runner.invoke(app, ["convert", "specs", "--json"])
    assert result.exit_code == 0
    counts = {s["name"]: s["target_tensors"] for s in json.loads(result.stdout)}
    assert counts["qwen35-dense"] == {"te": 91}
    assert counts["qwen35-moe"] == {"te": 127}
    assert {"twin-dense", "twin-moe", "twin-moe-bias", "glm52-mini", "gpt-dense"} <= set(counts)
    table = runner.invoke(app, ["convert", "specs"])
    assert table.exit_code == 0
    assert "twin-moe-bias" in table.stdout


@pytest.mark.integration
def test_console_script_exit_codes(tmp_path, subprocess_env, bf16_dir):
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "alignflow", "convert", *args], env=subprocess_env,
                              capture_output=True, text=True, timeout=120)

    assert run("bf16", str(tmp_path / "missing"), str(tmp_path / "x")).returncode == 2
    assert run("megatron", str(bf16_dir), str(tmp_path / "mg"), "--spec", "nope").returncode == 2
    failed = run("megatron", str(bf16_dir), str(tmp_path / "mg"), "--spec", "twin-dense")
    assert failed.returncode == 1
    assert "problem(s)" in failed.stderr
    ok = run("megatron", str(bf16_dir), str(tmp_path / "mg"), "--spec", "twin-moe-bias")
    assert ok.returncode == 0
    assert "megatron: 81 tensors" in ok.stdout
