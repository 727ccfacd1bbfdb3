"""`variants:` of an experiment: every patched training validated at load, each problem at its patch's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config import load_experiment
from alignflow.config.experiment import variant_experiment
from alignflow.config.variants import deep_merge, patched_document, run_name
from alignflow.errors import ConfigError


def _write(tmp_path: Path, repo_root: Path, variants: str) -> Path:
    base = (repo_root / "experiments" / "demo-matrix.yaml").read_text()
    head = base[:base.index("variants:")]
    path = tmp_path / "m.yaml"
    path.write_text(head + variants)
    return path


def test_the_committed_demo_matrix_loads_with_its_variants(repo_root: Path) -> None:
    e = load_experiment(repo_root / "experiments" / "demo-matrix.yaml")
    assert e.variants is not None
    assert e.variants.reference == "00_baseline"
    assert e.variants.configs["05_bf16_writeback"].expect == "fail"
    bf16 = variant_experiment(e, "default", "05_bf16_writeback")
    assert bf16.name == "demo-matrix/05_bf16_writeback"
    assert bf16.training.bf16
    assert not e.training.bf16
    assert bf16.variants is None
    assert bf16.model == e.model  # what the patch leaves alone is the reference's


def test_an_unknown_key_in_a_patch_is_reported_at_the_patch_line(tmp_path: Path, repo_root: Path) -> None:
    path = _write(tmp_path, repo_root, """variants:
  configs:
    01_recompute:
      patch:
        training:
          recompte: full
""")
    with pytest.raises(ConfigError) as caught:
        load_experiment(path)
    (problem,) = caught.value.problems
    _file, line, message = problem
    assert line == path.read_text().splitlines().index("          recompte: full") + 1
    assert "variants.configs.01_recompute.patch.training.recompte: unknown key (did you mean 'recompute'?)" \
        in message


def test_a_patch_that_breaks_a_rule_of_the_whole_experiment_names_the_variant(tmp_path: Path,
                                                                               repo_root: Path) -> None:
    path = _write(tmp_path, repo_root, """variants:
  configs:
    03_split:
      patch: {training: {micro_batch_size: 3}}
""")
    with pytest.raises(ConfigError) as caught:
        load_experiment(path)
    (_, line, message), = caught.value.problems
    assert line == path.read_text().splitlines().index("      patch: {training: {micro_batch_size: 3}}") + 1
    assert "global_batch_size 4 is not a multiple of micro_batch_size 3" in message
    assert "(variant 03_split)" in message


def test_groups_patch_every_training_of_the_group_and_name_their_runs(tmp_path: Path, repo_root: Path) -> None:
    path = _write(tmp_path, repo_root, """variants:
  reference: 00_B
  groups:
    F200: {steps: 20, warmup_steps: 10}
    P32K: {steps: 6, patch: {training: {micro_batch_size: 1}}}
  configs:
    01_a: {patch: {training: {recompute: full}}}
    08_b: {patch: {training: {bias_swiglu_fusion: true}}, groups: [P32K]}
""")
    e = load_experiment(path)
    assert e.variants is not None
    assert e.variants.configs_in("F200") == ["01_a"]
    assert e.variants.configs_in("P32K") == ["01_a", "08_b"]
    assert e.variants.warmup("F200") == 10
    assert e.variants.warmup("P32K") == 10
    ref = variant_experiment(e, "P32K", None)
    assert ref.name == "demo-matrix/P32K/00_B"
    assert (ref.training.steps, ref.training.micro_batch_size) == (6, 1)
    b = variant_experiment(e, "P32K", "08_b")
    assert (b.training.steps, b.training.micro_batch_size, b.training.bias_swiglu_fusion) == (6, 1, True)
    assert run_name("x", "g", "c", grouped=False) == "x/c"


@pytest.mark.parametrize(("variants", "expected"), [
    ("variants:\n  configs:\n    a: {patch: {name: other}}\n", "a variant cannot change the experiment's name"),
    ("variants:\n  configs:\n    a: {patch: {}, groups: [F500]}\n", "unknown group 'F500'"),
    ("variants:\n  reference: a\n  configs:\n    a: {patch: {}}\n", "'a' is the reference's name"),
    ("variants:\n  configs:\n    a/b: {patch: {}}\n", "use letters, digits"),
    ("variants:\n  configs:\n    a: {patch: {}}\n  pairs: [{configs: [a, bb]}]\n", "unknown config 'bb'"),
    ("variants:\n  configs: {}\n", "at least one config"),
])
def test_malformed_matrices_are_refused(tmp_path: Path, repo_root: Path, variants: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_experiment(_write(tmp_path, repo_root, variants))


@pytest.mark.parametrize(("variants", "marked", "expected"), [
    ("variants:\n  configs:\n    01_recompute: {patch: {}}\n    02_fusion: {patch: {}}\n  pairs:\n"
     "    - {switch: s, configs: [01_recompte, 02_fusion]}\n",
     "    - {switch: s", "variants.pairs.0.configs.0: unknown config '01_recompte' (did you mean '01_recompute'?)"),
    ("variants:\n  groups: {F200: {steps: 4}}\n  configs:\n    a:\n      patch: {}\n      groups: [F20]\n",
     "      groups: [F20]", "variants.configs.a.groups.0: unknown group 'F20' (did you mean 'F200'?)"),
    ("variants:\n  groups: {F200: {steps: 4}}\n  configs:\n    a: {patch: {}}\n    b: {patch: {}}\n  pairs:\n"
     "    - configs: [a, b]\n      groups: [F2000]\n",
     "      groups: [F2000]", "variants.pairs.0.groups.0: unknown group 'F2000' (did you mean 'F200'?)"),
    ("variants:\n  reference: a\n  configs:\n    b: {patch: {}}\n    a: {patch: {}}\n",
     "    a: {patch: {}}", "variants.configs.a: 'a' is the reference's name"),
    ("variants:\n  configs:\n    a: {patch: {}}\ngolden:\n  metrics:\n    - lm_los\n    - lm_loss\n",
     "    - lm_los", "golden.metrics.0: no margin for 'lm_los' (did you mean 'lm_loss'?)"),
])
def test_a_wrong_name_is_reported_at_its_own_line_with_the_closest_name(tmp_path: Path, repo_root: Path,
                                                                        variants: str, marked: str,
                                                                        expected: str) -> None:
    path = _write(tmp_path, repo_root, variants)
    with pytest.raises(ConfigError) as caught:
        load_experiment(path)
    (problem,) = caught.value.problems
    _file, line, message = problem
    assert message.startswith(expected)
    assert line == next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith(marked))


def test_deep_merge_merges_mappings_and_replaces_the_rest() -> None:
    base = {"training": {"lr": 1.0, "steps": 3}, "gpu": {"extra_args": ["--a"]}}
    merged = deep_merge(base, {"training": {"lr": 2.0}, "gpu": {"extra_args": ["--b"]}})
    assert merged == {"training": {"lr": 2.0, "steps": 3}, "gpu": {"extra_args": ["--b"]}}
    assert base["training"]["lr"] == 1.0  # the base is not touched


def test_the_reference_document_drops_the_matrix(repo_root: Path) -> None:
    e = load_experiment(repo_root / "experiments" / "demo-matrix.yaml")
    assert e.variants is not None
    doc = patched_document(e.model_dump(mode="json"), e.variants, "default", None)
    assert "variants" not in doc
    assert doc["training"] == e.model_dump(mode="json")["training"]


def test_a_rule_of_the_whole_experiment_broken_by_a_patch_points_at_the_patch(tmp_path: Path,
                                                                             repo_root: Path) -> None:
    path = _write(tmp_path, repo_root, """variants:
  configs:
    04_dp4:
      patch: {gpu: {parallel: {dp: 4}}}
""")
    with pytest.raises(ConfigError) as caught:
        load_experiment(path)
    (_, line, message), = caught.value.problems
    assert line == path.read_text().splitlines().index("      patch: {gpu: {parallel: {dp: 4}}}") + 1
    assert message.startswith("variants.configs.04_dp4.patch: gpu layout: training.global_batch_size 4 is not a "
                              "multiple of micro_batch_size 2 x dp 4")


def test_an_experiment_without_the_new_sections_records_what_it_recorded_before(repo_root: Path) -> None:
    """The nightly's baseline is the last pass of the same configuration fingerprint: unset, the matrix, the
    goldens and the computation switches are not in the recorded mapping, so no fingerprint moved with them."""
    doc = load_experiment(repo_root / "experiments" / "demo.yaml").model_dump(mode="json")
    assert "variants" not in doc
    assert "golden" not in doc
    assert "recompute" not in doc["training"]
    assert "bias_swiglu_fusion" not in doc["training"]
    matrix = load_experiment(repo_root / "experiments" / "demo-matrix.yaml")
    assert "variants" in matrix.model_dump(mode="json")
    assert "golden" in matrix.model_dump(mode="json")
    assert variant_experiment(matrix, "default", "01_recompute").model_dump(mode="json")["training"][
        "recompute"] == "full"
