"""A full resume continues a run exactly, on both sides; and the jit-compiled MindSpore step trains as PyNative."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.logs import Resolution, parse_log
from alignflow.twin.presets import preset
from alignflow.twin.render import mindformers_config

from .conftest import BASE_STEPS, TwinData, run_mindspore, run_torch, torch_argv, training

pytestmark = pytest.mark.slow
E6 = Resolution("significant", 6)  # Megatron prints losses `{:.6E}`


def test_mindspore_resume_from_step_two_repeats_steps_three_and_four(
        ms_base: Path, twin_data: TwinData, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    cfg = mindformers_config(preset(), training(BASE_STEPS), data_path=str(twin_data.path),
                             data_sha256=twin_data.sha256, load_path=str(ms_base / "iteration_00000002"),
                             save_path=None, steps=BASE_STEPS, no_load_optim=False, jit=False)
    run = run_mindspore(cfg, tmp_path, subprocess_env)
    assert run.returncode == 0, run.stdout + run.stderr
    resumed = parse_log(run.lines).frame
    original = parse_log((ms_base.parent / "base.log").read_text().splitlines(keepends=True)).frame
    assert list(resumed.index) == [3, 4]
    for column in ("lm_loss", "mtp_1_loss", "load_balancing_loss", "grad_norm", "lr", "consumed_samples"):
        assert list(resumed[column]) == list(original.loc[[3, 4], column]), column


@pytest.mark.parametrize("version", ["0.15", "0.16"])
def test_torch_resume_from_iteration_two_repeats_iterations_three_and_four(
        version: str, twin_data: TwinData, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    # 0.15 logging: every line is its own iteration's. 0.16+ averages each process's first printed iteration into
    # its next line (iteration 2 of the full run, iteration 4 of the resumed one); the parser takes both back, so
    # the resumed iteration 4 equals the uninterrupted one to within the rounding of two printed values.
    save = tmp_path / "save"
    full = run_torch(torch_argv(twin_data, load=None, steps=4, save=save, save_interval=2, megatron_version=version),
                     tmp_path, subprocess_env, data=twin_data, version=version)
    assert full.returncode == 0, full.stderr
    assert sorted(p.name for p in save.iterdir()) == [
        "iter_0000002", "iter_0000004", "latest_checkpointed_iteration.txt"]
    (save / "latest_checkpointed_iteration.txt").write_text("2")  # as if the job had died after iteration 2
    argv = torch_argv(twin_data, load=save, steps=4, megatron_version=version)
    for flag in ("--finetune", "--no-load-optim"):
        argv.remove(flag)
    resumed = run_torch(argv, tmp_path, subprocess_env, data=twin_data, version=version)
    assert resumed.returncode == 0, resumed.stderr
    assert f" loading checkpoint from {save} at iteration 2" in resumed.stdout
    a, b = parse_log(full.lines).frame, parse_log(resumed.lines).frame
    assert list(b.index) == [3, 4]
    for column in ("grad_norm", "lr", "consumed_samples"):
        assert list(b[column]) == list(a.loc[[3, 4], column]), column
    for column in ("lm_loss", "mtp_1_loss", "load_balancing_loss"):
        assert b.loc[3, column] == a.loc[3, column], column
        if version == "0.15":
            assert b.loc[4, column] == a.loc[4, column], column
        else:  # 2 * line_4 - line_3: up to 3 half-units of the last printed digit (`{:.6E}`) away
            assert abs(b.loc[4, column] - a.loc[4, column]) <= 1.5 * E6.quantum(a.loc[4, column]) + 1e-12, column
    # the resumed run appended to the same log: one restart, each process de-averaged on its own
    both = parse_log(full.lines + resumed.lines)
    assert both.repeated_steps == (3, 4)
    assert both.frame.loc[4, "lm_loss"] == b.loc[4, "lm_loss"]
    assert both.first_interval is not None
    assert both.first_interval.corrected_steps == (() if version == "0.15" else (2, 4))


def test_mindspore_jit_and_plain_pynative_train_the_same(ms_base: Path, twin_data: TwinData,
                                                         subprocess_env: dict[str, str], tmp_path: Path) -> None:
    frames = []
    for jit in (True, False):
        cfg = mindformers_config(preset(), training(3), data_path=str(twin_data.path), data_sha256=twin_data.sha256,
                                 load_path=str(ms_base), save_path=None, steps=3, jit=jit)
        run = run_mindspore(cfg, tmp_path / str(jit), subprocess_env)
        assert run.returncode == 0, run.stdout + run.stderr
        frames.append(parse_log(run.lines).frame)
    for column in ("lm_loss", "mtp_1_loss", "load_balancing_loss", "grad_norm"):
        assert frames[0][column].astype(float).to_numpy() == pytest.approx(
            frames[1][column].astype(float).to_numpy(), rel=1e-5, abs=2e-6), column
