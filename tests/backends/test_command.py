"""The `command` backend: any trainer from a launch template, its declared log and checkpoint formats, and preflight
over what it passes and declares (never more)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alignflow.backends import pipeline_for
from alignflow.backends.commands import step_command
from alignflow.config import load_experiment
from alignflow.errors import ConfigError
from alignflow.logs.formats import LogFormatSpec
from alignflow.logs.parse import parse_log
from alignflow.preflight import check_experiment
from tests.recipes.copies import copy_twin

REGEX = r"step (?P<step>\d+)/(?P<max_steps>\d+) loss (?P<lm_loss>\S+) grad_norm (?P<grad_norm>\S+)"
LAUNCH = ["{python}", "train.py", "--load", "{load}", "--data", "{data}", "--steps", "{steps}", "--seed", "{seed}",
          "--lr", "{lr}", "--mbs", "{micro_batch_size}", "--gbs", "{global_batch_size}", "--out", "{out}/x",
          "--nproc", "{nproc}", "--literal", "{{not a placeholder}}"]


def _command_side(**extra: object) -> dict[str, object]:
    return {"kind": "command", "launch": LAUNCH, "log": {"regex": REGEX, "path": "logs/train.log"},
            "checkpoint": {"loads": "megatron"}, "loaded_line": "loaded checkpoint", **extra}


def _experiment(repo_root: Path, tmp_path: Path, **edits: object):  # type: ignore[no-untyped-def]
    return load_experiment(copy_twin(repo_root, tmp_path, edits=edits))


def test_the_launch_template_is_filled_with_the_pipelines_values(repo_root: Path, tmp_path: Path) -> None:
    exp = _experiment(repo_root, tmp_path, gpu=_command_side(env={"SHA": "{data_sha256}"}))
    template = step_command(exp, "gpu_train", data_sha256="ab" * 32).template
    assert template.argv == ("{python}", "train.py", "--load", "{in:megatron_ckpt}", "--data", "{in:data}/tiny",
                             "--steps", "8", "--seed", "1234", "--lr", "0.001", "--mbs", "4", "--gbs", "4",
                             "--out", "{out}/x", "--nproc", "1", "--literal", "{not a placeholder}")
    assert template.env == {"SHA": "ab" * 32}
    assert template.log == "logs/train.log"
    assert template.required_lines == ("loaded checkpoint",)
    assert isinstance(template.log_format, LogFormatSpec)


def test_the_pipeline_follows_the_command_sides_checkpoint_format(repo_root: Path, tmp_path: Path) -> None:
    exp = _experiment(repo_root, tmp_path, gpu=_command_side())
    assert pipeline_for(exp).load("gpu") == "megatron_ckpt"  # MindFormers base -> Megatron, as for Megatron-LM
    side = _command_side(checkpoint={"loads": "mindformers"})
    same = pipeline_for(_experiment(repo_root, tmp_path / "same", gpu=side))
    assert [s.name for s in same.steps if s.converts] == ["convert_bf16"]  # no conversion for the command side
    assert same.load("gpu") == same.load("npu") == "bf16_ckpt"


def test_an_unknown_placeholder_is_refused_with_its_line(repo_root: Path, tmp_path: Path) -> None:
    path = copy_twin(repo_root, tmp_path, edits={"gpu": _command_side(launch=["train.py", "--x", "{lod}"])})
    with pytest.raises(ConfigError, match=r"tiny.yaml:\d+: gpu.launch: .*unknown placeholder\(s\) \{lod\}; known:"):
        load_experiment(path)


def test_a_log_regex_without_a_step_group_is_refused(repo_root: Path, tmp_path: Path) -> None:
    path = copy_twin(repo_root, tmp_path, edits={"gpu": _command_side(log={"regex": r"loss (?P<lm_loss>\S+)"})})
    with pytest.raises(ConfigError, match=r"gpu.log: .*has no \(\?P<step>...\) group"):
        load_experiment(path)


def test_a_base_training_cannot_load_and_must_save(repo_root: Path, tmp_path: Path) -> None:
    exp = _experiment(repo_root, tmp_path, npu=_command_side(checkpoint={"loads": "megatron", "saves": "megatron"}))
    with pytest.raises(ConfigError, match=r"npu.launch uses \{load\}, but npu_base_train loads no checkpoint"):
        step_command(exp, "npu_base_train", data_sha256="")
    saving = [a for a in LAUNCH if a not in ("--load", "{load}")]
    exp = _experiment(repo_root, tmp_path / "nosave",
                      npu=_command_side(launch=saving, checkpoint={"loads": "megatron", "saves": "megatron"}))
    with pytest.raises(ConfigError, match=r"npu_base_train trains the base checkpoint: npu.launch must write it at"):
        step_command(exp, "npu_base_train", data_sha256="")
    # a side that saves no checkpoint cannot train the base: refused where the file is read, at its `kind:` line
    with pytest.raises(ConfigError, match=r"tiny.yaml:\d+: npu.kind: the NPU side's backend \(command\) cannot "
                                          r"save the base checkpoint .* give the experiment a `base:"):
        _experiment(repo_root, tmp_path / "cannot", npu=_command_side())


def test_preflight_compares_what_the_command_passes_and_declares_and_checks_nothing_else(
        repo_root: Path, tmp_path: Path) -> None:
    side = _command_side(settings={"model.num_layers": 1, "opt.beta2": 0.999, "model.hidden_size": 128})
    report = check_experiment(_experiment(repo_root, tmp_path, gpu=side))
    status = {f.setting: f.status for f in report.findings}
    assert status["train.init_seed"] == status["data.seed"] == status["opt.lr"] == "ok"  # passed by the template
    assert status["data.file"] == "ok"  # {data} is the experiment's data
    assert status["model.num_layers"] == status["model.hidden_size"] == "ok"  # declared, and equal
    assert status["opt.beta2"] == "mismatch"  # declared 0.999; the NPU side trains with 0.95
    assert status["model.vocab_size"] == status["moe.num_experts"] == "unchecked"  # neither passed nor declared
    assert not report.ok
    assert f"{len(report.unchecked)} not checked (not declared:" in report.summary()
    unchecked = next(f for f in report.findings if f.setting == "model.vocab_size")
    assert unchecked.gpu is not None
    assert unchecked.gpu.source == "not declared (gpu.settings)"


def test_a_setting_preflight_does_not_know_is_refused(repo_root: Path, tmp_path: Path) -> None:
    exp = _experiment(repo_root, tmp_path, gpu=_command_side(settings={"model.num_layer": 1}))
    with pytest.raises(ConfigError, match=r"gpu.settings: unknown setting\(s\) model.num_layer; preflight compares:"):
        check_experiment(exp)


def test_the_declared_log_format_reads_the_trainers_lines_with_their_resolution(
        repo_root: Path, tmp_path: Path) -> None:
    exp = _experiment(repo_root, tmp_path, gpu=_command_side())
    fmt = step_command(exp, "gpu_train", data_sha256="").template.log_format
    assert isinstance(fmt, LogFormatSpec)
    lines = ["starting", "step 1/3 loss 5.5410 grad_norm 1.25", "noise step x", "step 2/3 loss 5.4000 grad_norm 1.2",
             "step 3/3 loss 5.3100 grad_norm 1.1"]
    parsed = parse_log(lines, fmt=fmt, source="train.log")
    assert parsed.fmt == "declared"
    assert parsed.frame["lm_loss"].tolist() == [5.541, 5.4, 5.31]
    assert parsed.max_steps == 3
    assert parsed.resolution["lm_loss"].digits == 4
    broken = parse_log([*lines[:2], "step 2/3 loss five grad_norm 1.2", lines[-1]], fmt=fmt, source="train.log")
    assert [s.kind for s in broken.sentinels if s.line_no == 3], broken.sentinels


def test_the_experiment_file_round_trips_its_command_side(repo_root: Path, tmp_path: Path) -> None:
    exp = _experiment(repo_root, tmp_path, gpu=_command_side())
    again = yaml.safe_load(yaml.safe_dump(exp.model_dump(mode="json")))
    assert again["gpu"]["launch"] == LAUNCH
    assert again["gpu"]["log"]["regex"] == REGEX
