"""What the real Megatron code refuses, alignflow refuses first, from the command line a user types: preflight on a GPU
host without Transformer Engine, the conversion to a flavour no Megatron spec builds, a Megatron release nobody
checked. (That megatron-core itself raises each cited error at the cited line is tests/recipes/test_megatron_core.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.errors import ConfigError
from alignflow.frameworks.megatron_refusals import REFUSALS
from tests.recipes.copies import recipe_copy

ROW = {r.key: r for r in REFUSALS}


def _hosts_without_te(repo_root: Path, dest: Path) -> Path:
    data = yaml.safe_load((repo_root / "hosts.ssh.example.yaml").read_text())
    data["hosts"]["gpu-a"]["cuda_extensions"] = []
    path = dest / "hosts.no-te.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("name", ["glm52_mini", "glm52_1b"])
def test_preflight_of_glm52_on_a_host_without_te_names_what_needs_te(repo_root: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     name: str) -> None:
    hosts = _hosts_without_te(repo_root, tmp_path)
    monkeypatch.chdir(repo_root)
    result = CliRunner().invoke(app, ["preflight", f"experiments/{name}.yaml", "--hosts", str(hosts)])
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "--transformer-impl transformer_engine on the GPU host (no Transformer Engine, no Apex)" in out
    assert "this model needs Transformer Engine" in out
    assert ("DSA (--experimental-attention-variant dsa): without it megatron-core 0.19 stops at spec level with "
            "AssertionError: Experimental GPT decoder block spec only supports transformer engine implementation for "
            "now. (megatron/core/models/gpt/experimental_attention_variant_module_specs.py:442)") in out
    assert ("MLA (--multi-latent-attention): without it megatron-core 0.19 stops at model level with TypeError: "
            "DotProductAttention.__init__() got an unexpected keyword argument 'k_channels' "
            "(megatron/core/transformer/multi_latent_attention.py:214)") in out
    # with the host's Transformer Engine declared (the example inventory), the same recipe passes
    ok = CliRunner().invoke(app, ["preflight", f"experiments/{name}.yaml", "--hosts", "hosts.ssh.example.yaml"])
    assert ok.exit_code == 0, ok.output


def test_preflight_refuses_the_glm52_recipe_rendered_for_the_local_implementation(repo_root: Path,
                                                                                  tmp_path: Path) -> None:
    # The spec writes only the TE flavour (no local spec builds MLA or DSA: the convert test below names
    # megatron-core's lines), so the experiment is refused where its file is read, at gpu.transformer_impl's line
    # (alignflow.config.names, issue 40) - validate and run alike, before the refusal table is reached.
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.transformer_impl": "local"})
    hosts = _hosts_without_te(repo_root, tmp_path)
    result = CliRunner().invoke(app, ["preflight", str(path), "--hosts", str(hosts)])
    assert isinstance(result.exception, ConfigError), result.output  # `alignflow.cli.main` prints it, exit 2
    assert result.exception.exit_code == 2
    out = " ".join(str(result.exception).split())
    assert f"{path}:" in out
    assert ("gpu.transformer_impl: local needs the 'local' flavour of the converted checkpoint, and conversion.spec "
            "'glm52-mini' writes only: te") in out


@pytest.mark.parametrize(("version", "row"), [("0.17", "dsa-needs-0.18"), ("0.16", "dsa-needs-0.18")])
def test_preflight_refuses_glm52_on_a_megatron_core_without_dsa(repo_root: Path, tmp_path: Path, version: str,
                                                                 row: str) -> None:
    """The recipes declared 0.17, whose experimental block spec has no DSA: they could never have run."""
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.megatron_version": version,
                                                                       "gpu.fixes": []})
    result = CliRunner().invoke(app, ["preflight", str(path), "--hosts", str(repo_root / "hosts.ssh.example.yaml")])
    assert result.exit_code == 1, result.output
    assert ROW[row].line(version) in " ".join(result.output.split())


def test_preflight_refuses_glm52_on_0_19_without_the_declared_fix_naming_the_builder_line(repo_root: Path,
                                                                                           tmp_path: Path) -> None:
    """core_v0.19.0's pretrain_gpt.py builds through the ModelBuilder, whose MTP spec asserts on DSA (issue 50: rc 1 at
    model build on the H100 with preflight passing); the recipe declares alignflow's fix, a copy without it is
    refused."""
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.fixes": []})
    result = CliRunner().invoke(app, ["preflight", str(path), "--hosts", str(repo_root / "hosts.ssh.example.yaml")])
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert ROW["mtp-variant-builder"].line("0.19") in out
    assert "megatron/core/models/gpt/gpt_layer_specs.py:572" in out
    ok = CliRunner().invoke(app, ["preflight", str(repo_root / "experiments" / "glm52_mini.yaml"), "--hosts",
                                  str(repo_root / "hosts.ssh.example.yaml")])
    assert ok.exit_code == 0, ok.output


def test_preflight_refuses_glm52_on_0_18_whose_mtp_layer_gets_plain_mla(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.megatron_version": "0.18",
                                                                       "gpu.fixes": []})
    result = CliRunner().invoke(app, ["preflight", str(path), "--hosts", str(repo_root / "hosts.ssh.example.yaml")])
    assert result.exit_code == 1, result.output
    assert ROW["mtp-dsa-plain-mla"].line("0.18") in " ".join(result.output.split())


def test_a_fix_declared_for_another_release_is_a_configuration_error(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.megatron_version": "0.18"})
    result = CliRunner().invoke(app, ["render", str(path), "gpu_train"])
    assert isinstance(result.exception, ConfigError), result.output  # `alignflow.cli.main` prints it, exit 2
    assert "gpu.fixes: mtp-experimental-attention is written for megatron-core 0.19, not 0.18" in str(result.exception)


@pytest.mark.parametrize("spec", ["glm52-mini", "glm52-1b"])
def test_convert_to_the_local_flavour_of_glm52_is_refused(tmp_path: Path, spec: str) -> None:
    (tmp_path / "bf16").mkdir()
    result = CliRunner().invoke(app, ["convert", "megatron", str(tmp_path / "bf16"), str(tmp_path / "mg"),
                                      "--spec", spec, "--flavor", "local", "--megatron-version", "0.19"])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert f"spec {spec}: no local (non-Transformer-Engine) layer spec of megatron-core 0.19 builds this model" in out
    assert ROW["variant-needs-te"].source["0.19"] in out
    assert ROW["mla-needs-te"].source["0.19"] in out
    assert not (tmp_path / "mg").exists()


@pytest.mark.parametrize("command", ["preflight", "render"])
def test_an_unchecked_megatron_release_is_refused_by_name(repo_root: Path, tmp_path: Path, command: str) -> None:
    path = recipe_copy(repo_root, tmp_path, "qwen35_moe", experiment={"gpu.megatron_version": "0.20"})
    argv = [command, str(path), *(["gpu_train"] if command == "render" else [])]
    result = CliRunner().invoke(app, [*argv, "--hosts", str(repo_root / "hosts.ssh.example.yaml")])
    assert isinstance(result.exception, ConfigError), result.output  # `alignflow.cli.main` prints it, exit 2
    assert result.exception.exit_code == 2
    out = " ".join(str(result.exception).split())
    assert "megatron-core 0.20 is not accepted: Megatron-LM main (megatron-core 0.20.0) is not a release" in out
    assert "cannot build any MTP model without Transformer Engine" in out
