"""Edited copies of the committed recipes (experiment + its MindFormers template), for injecting the seeds' bugs.

A copy keeps the recipe's layout (`<dir>/<name>.yaml`, `<dir>/templates/<name>.yaml`), so the experiment's
relative template path resolves as it does in the repository; edits are dotted keys (`model.moe.norm_topk_prob`)
applied to the parsed YAML, list appends with a trailing `+` (`gpu.extra_args+`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from alignflow.config import Inventory, load_experiment, load_hosts
from alignflow.config.experiment import Experiment

RECIPES = ("qwen35_dense", "qwen35_moe", "glm52_mini", "glm52_1b")


def _edit(data: dict[str, Any], edits: dict[str, Any]) -> None:
    for dotted, value in edits.items():
        append = dotted.endswith("+")
        *parents, last = dotted.rstrip("+").split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None and not append:
            node.pop(last, None)
        elif append:
            node.setdefault(last, []).extend(value)
        else:
            node[last] = value


def recipe_copy(repo_root: Path, dest: Path, name: str, *, experiment: dict[str, Any] | None = None,
                template: dict[str, Any] | None = None) -> Path:
    """Copy recipe `name` into `dest` with `experiment` / `template` edits (value None deletes the key)."""
    src = repo_root / "experiments"
    (dest / "templates").mkdir(parents=True, exist_ok=True)
    exp_data = yaml.safe_load((src / f"{name}.yaml").read_text())
    tpl_rel = exp_data["npu"]["template"]
    tpl_data = yaml.safe_load((src / tpl_rel).read_text())
    _edit(exp_data, experiment or {})
    _edit(tpl_data, template or {})
    (dest / tpl_rel).write_text(yaml.safe_dump(tpl_data, sort_keys=False))
    path = dest / f"{name}.yaml"
    path.write_text(yaml.safe_dump(exp_data, sort_keys=False))
    return path


def example_inventory(repo_root: Path) -> Inventory:
    return load_hosts(repo_root / "hosts.ssh.example.yaml")


def load_copy(path: Path, repo_root: Path) -> Experiment:
    return load_experiment(path, example_inventory(repo_root))


def copy_twin(repo_root: Path, dest: Path, source: str = "tests/data/flow/tiny.yaml",
              edits: dict[str, Any] | None = None) -> Path:
    """A twin experiment (default: the flow tests' tiny one) with edits, its spec copied beside it."""
    from alignflow.convert.registry import SPEC_DIR

    dest.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((repo_root / source).read_text())
    _edit(data, edits or {})
    shutil.copy(SPEC_DIR / "twin-moe.yaml", dest / "twin-moe.yaml")
    path = dest / Path(source).name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
