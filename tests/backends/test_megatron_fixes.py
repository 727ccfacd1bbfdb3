"""A fixed Megatron as a declared, recorded input (issue 50): `gpu.fixes` renders a launcher that runs each fix
before `pretrain_gpt.py`, versions the step by the fix's sha256 and records the fix as an input of the step."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from alignflow.backends.commands import step_command
from alignflow.config import load_experiment
from alignflow.errors import ConfigError
from alignflow.frameworks.megatron_fixes import LAUNCHER, resolve_fix
from alignflow.runner.jobstep import code_file_refs
from tests.recipes.copies import example_inventory, recipe_copy


def _template(path: Path, repo_root: Path):  # type: ignore[no-untyped-def]
    return step_command(load_experiment(path, example_inventory(repo_root)), "gpu_train", data_sha256="").template


def test_a_declared_fix_runs_before_the_entry_and_versions_the_step(repo_root: Path) -> None:
    fix = resolve_fix("mtp-experimental-attention")
    template = _template(repo_root / "experiments" / "glm52_mini.yaml", repo_root)
    assert template.argv[template.argv.index("{out}/" + LAUNCHER) + 1] == "--transformer-impl"
    launcher = template.files[LAUNCHER]
    assert launcher.index(fix.file_name) < launcher.index("runpy.run_path(ENTRY, run_name='__main__')")
    assert "ENTRY = '/data/src/Megatron-LM/pretrain_gpt.py'" in launcher
    assert template.files[fix.file_name] == fix.source
    assert f"fix mtp-experimental-attention@{fix.sha256[:12]}" in template.code_version
    (ref,) = code_file_refs(template, "gpu-a", "/w/out").values()
    digest = hashlib.sha256(fix.source.encode()).hexdigest()
    assert (ref.name, ref.path, ref.sha256) == ("megatron fix mtp-experimental-attention", f"/w/out/{fix.file_name}",
                                                digest)


def test_a_fix_of_the_users_is_read_relative_to_the_experiment_and_fingerprinted(repo_root: Path,
                                                                                 tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.fixes": ["my_patch.py"]})
    (path.parent / "my_patch.py").write_text("print('patched')\n")
    template = _template(path, repo_root)
    assert template.files["megatron_fix_my_patch.py"] == "print('patched')\n"
    assert "fix my_patch@" + hashlib.sha256(b"print('patched')\n").hexdigest()[:12] in template.code_version
    (path.parent / "my_patch.py").write_text("print('patched again')\n")
    assert _template(path, repo_root).code_version != template.code_version  # a changed fix is a changed step


def test_an_unknown_fix_is_a_configuration_error(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.fixes": ["mtp-experimental"]})
    with pytest.raises(ConfigError, match="not a fix alignflow ships"):
        _template(path, repo_root)
