"""Preflight refuses a Megatron command line that `pretrain_gpt.py`'s own parser would refuse.

The tables under `alignflow/frameworks/megatron_flags/` were generated from Megatron-LM checkouts
(`python -m alignflow.frameworks.megatron_lm table CHECKOUT`); `test_megatron_lm_args.py` regenerates them from a
checkout when one is given and checks they are unchanged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.backends import TrainSpec, render_training
from alignflow.backends.commands import data_placeholder, step_command
from alignflow.cli import app
from alignflow.config import load_experiment
from alignflow.errors import ConfigError
from alignflow.frameworks.megatron_lm import available, check_flags, describe_parser, load_table, parser_from_table
from alignflow.preflight import check_experiment
from alignflow.preflight.megatron_combos import combination_problems
from alignflow.preflight.sides import _megatron_flags
from tests.recipes.copies import RECIPES, example_inventory, load_copy, recipe_copy


def test_every_tabled_version_knows_megatrons_core_flags() -> None:
    assert available() == ["0.16", "0.17", "0.18", "0.19"]
    for version in available():
        table = load_table(version)
        assert table is not None
        assert table["source"].startswith(f"Megatron-LM core_v{version}.")
        rows = {flag: row for row in table["arguments"] for flag in row["flags"]}
        assert (rows["--lr"]["nargs"], rows["--lr"]["type"]) == (None, "float")
        assert rows["--swiglu"]["nargs"] == 0
        assert rows["--data-path"]["nargs"] == "*"
        assert {"constant", "cosine", "linear"} <= set(rows["--lr-decay-style"]["choices"])
        assert {"local", "transformer_engine"} <= set(rows["--transformer-impl"]["choices"])
    assert load_table("0.16.1") == load_table("0.16")
    assert load_table("0.15") is None
    # flags come and go between releases: the MTP inner layer's rename is 0.17, and so are new flags
    flags = {v: {f for row in load_table(v)["arguments"] for f in row["flags"]} for v in available()}
    assert flags["0.16"] - flags["0.19"] or flags["0.19"] - flags["0.16"]


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_command_line_is_accepted_by_its_megatron(repo_root: Path, name: str) -> None:
    exp = load_experiment(repo_root / "experiments" / f"{name}.yaml")
    gate = TrainSpec("early_gate", "gpu", exp.gate.steps, data_placeholder(exp), "", "{in:megatron_ckpt}", None)
    for argv in (step_command(exp, "gpu_train", data_sha256="").template.argv, render_training(exp, gate).argv):
        accepted, why = check_flags(_megatron_flags(exp, argv), exp.gpu.megatron_version)
        assert accepted is True, why


def test_a_rebuilt_parser_accepts_and_refuses_what_the_original_does() -> None:
    original = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    original.add_argument("--lr", type=float)
    original.add_argument("--layers", "--num-layers", dest="num_layers", type=int)
    original.add_argument("--style", choices=["constant", "cosine"])
    original.add_argument("--level", type=int, choices=[0, 1, 2])
    original.add_argument("--paths", nargs="*")
    original.add_argument("--pair", nargs=2, type=int)
    original.add_argument("--on", action="store_true")
    original.add_argument("--grad-fusion", action=argparse.BooleanOptionalAction)
    table = {"source": "test", "arguments": json.loads(json.dumps(describe_parser(original)))}
    rebuilt = parser_from_table(table)
    cases = [
        ["--lr", "3e-4", "--num-layers", "8", "--style", "cosine", "--level", "2", "--on"],
        ["--paths", "a", "b", "--pair", "1", "2", "--no-grad-fusion", "--layers", "3"],
        ["--paths", "--on"], ["--lr=1e-3"], ["--lr", "x"], ["--style", "cosin"], ["--level", "3"],
        ["--pair", "1"], ["--lr"], ["--num-layer", "8"], ["--on", "yes"], ["--lay", "3"],
    ]
    for argv in cases:
        outcome = []
        for parser in (original, rebuilt):
            try:
                _, unknown = parser.parse_known_args(argv)  # switches' values are not tabled, only their arity
                outcome.append(("ok", unknown))
            except Exception:
                outcome.append(("refused",))
        assert outcome[0] == outcome[1], argv


@pytest.mark.parametrize(("edit", "expected"), [
    ({"--lr-warmup-iters": "--lr-warmup-iter"}, "unknown flag --lr-warmup-iter (did you mean --lr-warmup-iters?)"),
    (["--lr-decay-style", "cosin"], "argument --lr-decay-style: invalid choice: 'cosin' (choose from "),
    (["--seed", "forty-two"], "argument --seed: invalid int value: 'forty-two'"),
    (["--swiglu", "true"], "stray value 'true' (after a flag that takes none?)"),
    (["--lr"], "argument --lr: expected one argument"),
    (["--micro-batch", "1"], "unknown flag --micro-batch"),  # no abbreviations: Megatron's allow_abbrev=False
])
def test_mistakes_are_named_as_megatrons_parser_would(repo_root: Path, edit: dict[str, str] | list[str],
                                                      expected: str) -> None:
    exp = load_experiment(repo_root / "experiments" / "qwen35_moe.yaml")
    argv = list(_megatron_flags(exp, step_command(exp, "gpu_train", data_sha256="").template.argv))
    argv = [edit.get(a, a) for a in argv] if isinstance(edit, dict) else [*argv, *edit]
    accepted, why = check_flags(argv, "0.17")
    assert (accepted, why[:why.index(": ") + 2]) == (False, "the parser of Megatron-LM core_v0.17.1 (megatron-core "
                                                           "0.17.1): ")
    assert expected in why


def test_preflight_stops_a_recipe_with_a_misspelt_extra_flag(repo_root: Path, tmp_path: Path) -> None:
    path = recipe_copy(repo_root, tmp_path, "glm52_mini", experiment={"gpu.extra_args+": ["--moe-grouped-gem"]})
    report = check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root))
    assert [f.setting for f in report.mismatches] == ["megatron.flags"]
    assert report.mismatches[0].line() == (
        "pretrain_gpt.py accepts every flag: GPU refused (the parser of Megatron-LM core_v0.19.0 (megatron-core "
        "0.19.1+5be9626709): unknown flag --moe-grouped-gem (did you mean --moe-grouped-gemm?)) — GPU must be "
        "accepted or not checked")
    result = CliRunner().invoke(app, ["preflight", str(path), "--hosts", str(repo_root / "hosts.ssh.example.yaml")])
    assert result.exit_code == 1, result.output
    assert "--moe-grouped-gem" in result.output


def test_a_flag_of_a_newer_megatron_is_refused_for_an_older_one(repo_root: Path, tmp_path: Path) -> None:
    new = sorted({f for r in load_table("0.19")["arguments"] for f in r["flags"]}
                 - {f for r in load_table("0.16")["arguments"] for f in r["flags"]})
    switch = next(f for f in new if next(r for r in load_table("0.19")["arguments"] if f in r["flags"])["nargs"] == 0)
    for version, ok in (("0.16", False), ("0.19", True)):
        path = recipe_copy(repo_root, tmp_path / version, "qwen35_dense",
                           experiment={"gpu.megatron_version": version, "gpu.extra_args+": [switch]})
        report = check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root))
        finding = next(f for f in report.findings if f.setting == "megatron.flags")
        assert (finding.status == "ok") is ok, finding.line()


@pytest.mark.parametrize(("version", "why"), [
    ("0.25", "alignflow has no flag table and no checked configuration, spec or model code for it"),
    ("0.20", "Megatron-LM main (megatron-core 0.20.0) is not a release"),
])
def test_a_megatron_version_without_checks_is_refused_by_name(repo_root: Path, tmp_path: Path, version: str,
                                                              why: str) -> None:
    path = recipe_copy(repo_root, tmp_path, "qwen35_dense", experiment={"gpu.megatron_version": version})
    with pytest.raises(ConfigError) as err:  # nothing renders for it: preflight, render and run stop here
        check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root))
    assert f"gpu.megatron_version: megatron-core {version} is not accepted: {why}" in str(err.value)
    assert "Accepted: 0.16, 0.17, 0.18, 0.19" in str(err.value)
    # a caller that skips the loader (a hand-built argv) is refused by preflight's combination check too
    accepted, problems = combination_problems(["--num-layers", "2"], env={}, version=version, extensions=None)
    assert accepted is False
    assert why in problems[0]
    if version == "0.20":
        assert "cannot build any MTP model without Transformer Engine" in problems[0]


def test_the_twin_is_not_held_to_megatron_lms_flags(repo_root: Path) -> None:
    report = check_experiment(load_experiment(repo_root / "experiments" / "demo.yaml"))
    assert "megatron.flags" not in {f.setting for f in report.findings}
