from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alignflow.errors import ConfigError
from alignflow.twin.mindformers_yaml import load_mindformers_config, model_config_from_mindformers
from alignflow.twin.presets import PRESETS, preset, twin_spec
from alignflow.twin.render import mindformers_config

from .conftest import training


def _write(tmp_path: Path, cfg: dict[str, object]) -> Path:
    path = tmp_path / "twin.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _cfg(name: str = "twin-moe", **kw: object) -> dict[str, object]:
    return mindformers_config(preset(name), training(30, **kw), data_path="d.tokens", data_sha256="a" * 64,
                              load_path="ckpt", save_path=None, steps=30)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_rendered_yaml_reads_back_as_the_same_model(tmp_path: Path, name: str) -> None:
    cfg = load_mindformers_config(_write(tmp_path, _cfg(name)))
    assert twin_spec(model_config_from_mindformers(cfg)) == twin_spec(preset(name))
    assert cfg.checkpoint.load_path == "ckpt"
    assert cfg.checkpoint.no_load_optim
    assert cfg.twin.data_sha256 == "a" * 64
    assert cfg.data_file == "d.tokens"


def test_schedule_keys_map_to_megatron_s_schedule(tmp_path: Path) -> None:
    cfg = load_mindformers_config(_write(tmp_path, _cfg(lr_decay_style="cosine", min_lr=1e-4)))
    schedule = cfg.lr_schedule()
    assert (schedule.style, schedule.warmup_steps, schedule.decay_steps, schedule.min_lr) == ("cosine", 3, 30, 1e-4)
    assert schedule(0) == 0.0
    assert schedule(3) == 1e-3
    assert schedule(30) == pytest.approx(1e-4)


def test_unknown_keys_are_rejected_with_file_line_and_path(tmp_path: Path) -> None:
    cfg = _cfg()
    cfg["training"]["sed"] = 1  # type: ignore[index]
    cfg["model"]["model_config"]["num_expert"] = 4  # type: ignore[index]
    path = _write(tmp_path, cfg)
    with pytest.raises(ConfigError) as err:
        load_mindformers_config(path)
    problems = {msg.split(":")[0]: (where, line) for where, line, msg in err.value.problems}
    assert set(problems) == {"training.sed", "model.model_config.num_expert"}
    lines = path.read_text().splitlines()
    for key, (where, line) in problems.items():
        assert where == str(path)
        assert line is not None
        assert lines[line - 1].strip().startswith(key.rsplit(".", 1)[1] + ":")


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("model.model_config", "compute_dtype", "bfloat16", "compute_dtype"),
    ("model.model_config", "use_interleaved_weight_layout_mlp", False, "use_interleaved_weight_layout_mlp"),
    ("train_dataset.dataloader", "shuffle", True, "shuffle"),
    ("train_dataset.dataloader.config", "seq_length", 64, "differs from model.model_config.seq_length"),
    ("train_dataset.dataloader.config", "split", "0.9, 0.1, 0", "split"),
    ("context", "mode", 0, "context.mode"),
])
def test_values_the_twin_does_not_implement(tmp_path: Path, section: str, key: str, value: object,
                                            message: str) -> None:
    cfg = _cfg()
    node = cfg
    for part in section.split("."):
        node = node[part]  # type: ignore[assignment]
    node[key] = value
    with pytest.raises(ConfigError, match=message):
        load_mindformers_config(_write(tmp_path, cfg))


def test_one_clip_coefficient_for_both_sides() -> None:
    from alignflow.twin.schedule import CLIP_EPS, LRSchedule, OptimSettings

    def settings(clip_grad: float) -> OptimSettings:
        return OptimSettings(LRSchedule(1e-3, 0.0, 0, 10, "constant"), weight_decay=0.0, beta1=0.9, beta2=0.95,
                             eps=1e-8, clip_grad=clip_grad, bf16_params=False)

    assert CLIP_EPS == 1e-6  # Megatron's clip_grad_by_total_norm_fp32
    for norm in (0.0, 0.3, 1.0, 2.5, 1e6):
        assert settings(1.0).clip_coeff(norm) == min(1.0, 1.0 / (norm + 1e-6))  # the formula both sides used
        assert settings(0.0).clip_coeff(norm) == 1.0  # 0 = no clipping
    assert settings(1.0).clip_coeff(4.0) < 1.0
    assert settings(1.0).clip_coeff(0.5) == 1.0
