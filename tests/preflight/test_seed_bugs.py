"""Every expensive bug of the seeds, injected into a committed recipe, is reported by preflight with both values
and where each came from — on whichever side it is injected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alignflow.preflight import PreflightReport, check_experiment
from tests.recipes.copies import example_inventory, load_copy, recipe_copy


def check(repo_root: Path, tmp_path: Path, recipe: str, **edits: dict[str, Any]) -> PreflightReport:
    path = recipe_copy(repo_root, tmp_path, recipe, **edits)
    return check_experiment(load_copy(path, repo_root), inventory=example_inventory(repo_root))


def only_mismatch(report: PreflightReport, setting: str) -> str:
    """The report fails on `setting` (and on nothing unrelated); returns its line."""
    assert not report.ok
    bad = {f.setting: f for f in report.mismatches}
    assert setting in bad, report.summary()
    return bad[setting].line()


# (recipe, edits, setting, NPU value and source, GPU value and source) — each row one seed bug on one side
BUGS = [
    # the real MindFormers 2.1.0 YAML of the CPU lab (experiments/templates/mindformers_cpu.yaml)
    pytest.param("mindformers-cpu", {"template": {"lr_scheduler.warmup_ratio": 0}}, "opt.warmup_steps",
                 "NPU 0 (lr_scheduler.warmup_ratio 0 x training.steps 10)", "GPU 1 (--lr-warmup-iters)",
                 id="lab-warmup-0-on-the-npu"),
    pytest.param("mindformers-cpu", {"experiment": {"npu.overrides": {"train_dataset.dataloader.config.seed": 42}}},
                 "data.seed", "NPU 42 (train_dataset.dataloader.config.seed)", "GPU 1234 (--seed)",
                 id="lab-data-seed-42-on-the-npu"),
    pytest.param("mindformers-cpu", {"template": {"model.rms_norm_eps": 1.0e-5}}, "model.norm_epsilon",
                 "NPU 1e-05 (model.rms_norm_eps)", "GPU 1e-06 (--norm-epsilon)", id="lab-norm-eps-on-the-npu"),
    pytest.param("qwen35_dense", {"experiment": {"gpu.extra_args+": ["--seed", "42"]}}, "data.seed",
                 "NPU 1234 (train_dataset.dataloader.config.seed)", "GPU 42 (--seed)",
                 id="seed001-10.1-megatron-seed-42"),
    pytest.param("qwen35_moe", {"experiment": {"npu.overrides": {"train_dataset.dataloader.config.seed": 42}}},
                 "data.seed", "NPU 42 (train_dataset.dataloader.config.seed)", "GPU 1234 (--seed)",
                 id="data-seed-42-on-the-npu-side"),
    pytest.param("glm52_1b", {"experiment": {"model.activation": "gelu", "model.gated_linear_unit": False}},
                 "model.activation", "NPU silu (model.hidden_act)", "GPU gelu (--swiglu absent",
                 id="seed000-4.4-gelu-on-the-gpu"),
    pytest.param("glm52_mini", {"template": {"model.hidden_act": "gelu"}}, "model.activation",
                 "NPU gelu (model.hidden_act)", "GPU silu (--swiglu)", id="gelu-on-the-npu"),
    pytest.param("qwen35_moe", {"template": {"model.norm_topk_prob": False}}, "moe.renormalize",
                 "NPU False (model.norm_topk_prob)", "GPU True (Megatron renormalises softmax top-k",
                 id="seed001-10.4-norm-topk-prob-false"),
    pytest.param("qwen35_moe", {"template": {"model.norm_topk_prob": None}}, "moe.renormalize",
                 "NPU False (model.norm_topk_prob unset: MindFormers default)", "GPU True",
                 id="norm-topk-prob-left-to-the-mindformers-default"),
    pytest.param("qwen35_moe", {"template": {"lr_scheduler.warmup_ratio": 0}}, "opt.warmup_steps",
                 "NPU 0 (lr_scheduler.warmup_ratio 0 x training.steps 1000)", "GPU 10 (--lr-warmup-iters)",
                 id="warmup-0-on-the-npu"),
    pytest.param("qwen35_dense", {"experiment": {"training.lr_warmup_iters": 0}}, "opt.warmup_steps",
                 "NPU 10 (lr_scheduler.warmup_ratio 0.01 x training.steps 1000)", "GPU 0 (--lr-warmup-iters)",
                 id="warmup-0-on-the-gpu"),
    pytest.param("glm52_mini", {"experiment": {"gpu.extra_args+": ["--hidden-dropout", "0.1"]}},
                 "model.hidden_dropout", "NPU 0 (model.hidden_dropout)", "GPU 0.1 (--hidden-dropout)",
                 id="dropout-0.1-on-the-gpu"),
    pytest.param("glm52_1b", {"template": {"model.attention_dropout": 0.1}}, "model.attention_dropout",
                 "NPU 0.1 (model.attention_dropout)", "GPU 0 (--attention-dropout)", id="dropout-0.1-on-the-npu"),
    pytest.param("qwen35_dense", {"experiment": {"gpu.extra_args+": ["--vocab-size", "248320"]}},
                 "model.vocab_size", "NPU 248320 (model.vocab_size)",
                 "GPU 248448 (--vocab-size 248320 + 1 (NullTokenizer eod) padded to a multiple of 128",
                 id="vocab-padding-forgot-nulltokenizer-eod"),
    pytest.param("glm52_1b", {"experiment": {"gpu.extra_args+": ["--make-vocab-size-divisible-by", "1024"]}},
                 "model.vocab_size", "NPU 154880 (model.vocab_size)",
                 "GPU 155648 (--vocab-size 154880 (NullTokenizer, eod included) padded to a multiple of 1024",
                 id="vocab-padding-divisor"),
    pytest.param("qwen35_moe", {"experiment": {"npu.overrides": {
        "train_dataset.dataloader.config.data_path": ["1", "/data/other/qwen35_text_document"]}}}, "data.file",
                 "NPU /data/other/qwen35_text_document -> not the experiment's data file",
                 "GPU {in:data}/qwen35_moe_text_document -> experiment data", id="different-data-file-on-the-npu"),
    pytest.param("glm52_mini", {"experiment": {"gpu.extra_args+": ["--data-path", "/data/old/glm_text_document"]}},
                 "data.file", "NPU {in:data}/glm52_mini_text_document -> experiment data",
                 "GPU /data/old/glm_text_document -> not the experiment's data file",
                 id="different-data-file-on-the-gpu"),
]


@pytest.mark.parametrize(("recipe", "edits", "setting", "npu", "gpu"), BUGS)
def test_seed_bug_is_reported_with_both_values_and_their_sources(
    repo_root: Path, tmp_path: Path, recipe: str, edits: dict[str, Any], setting: str, npu: str, gpu: str
) -> None:
    line = only_mismatch(check(repo_root, tmp_path, recipe, **edits), setting)
    assert npu in line
    assert gpu in line


def test_the_report_summary_lists_every_mismatch_and_nothing_that_agrees(repo_root: Path, tmp_path: Path) -> None:
    report = check(repo_root, tmp_path, "qwen35_moe",
                   experiment={"gpu.extra_args+": ["--seed", "42", "--hidden-dropout", "0.1"]},
                   template={"model.norm_topk_prob": False})
    assert {f.setting for f in report.mismatches} == {"data.seed", "train.init_seed", "model.hidden_dropout",
                                                      "moe.renormalize"}
    summary = report.summary()
    assert summary.startswith("preflight: 4 of ")
    assert "hidden dropout: NPU 0 (model.hidden_dropout) vs GPU 0.1 (--hidden-dropout)" in summary
    assert "GPU must be 0" in summary
    assert "layers" not in summary  # agreeing settings stay out of the summary


def test_dropout_must_be_zero_even_when_both_sides_agree(repo_root: Path, tmp_path: Path) -> None:
    report = check(repo_root, tmp_path, "glm52_mini", experiment={"model.hidden_dropout": 0.1},
                   template={"model.hidden_dropout": 0.1})
    line = only_mismatch(report, "model.hidden_dropout")
    assert "NPU must be 0" in line
    assert "GPU must be 0" in line
    assert "differ" not in line


def test_determinism_off_on_both_sides_is_a_mismatch(repo_root: Path, tmp_path: Path) -> None:
    report = check(repo_root, tmp_path, "qwen35_dense", experiment={"training.deterministic": False})
    line = only_mismatch(report, "det.deterministic")
    assert "NPU False (training.deterministic)" in line
    assert "GPU False (--deterministic-mode absent)" in line
    # the backend sets NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 only for deterministic runs, but gpu-a's env sets it too
    assert "det.nvte" not in {f.setting for f in report.mismatches}


def test_a_host_env_that_turns_hccl_determinism_off_is_overridden_by_the_job(repo_root: Path, tmp_path: Path
                                                                             ) -> None:
    report = check(repo_root, tmp_path, "glm52_mini", experiment={"npu.env": {"HCCL_DETERMINISTIC": "false"}})
    line = only_mismatch(report, "det.hccl")
    assert "HCCL_DETERMINISTIC=false (host npu-a + command env)" in line
