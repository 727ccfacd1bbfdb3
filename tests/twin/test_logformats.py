"""The twin prints the frameworks' lines byte for byte (golden lines from the framework references).

The step lines come from `alignflow.logs.render` (also covered by tests/logs/test_render.py); the calls below
are the twins' calls (`mindspore_train`: `mindformers_pynative_line(prefix="none")`; `torch_train`: `megatron_line`).
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

from alignflow.logs.render import megatron_line, mindformers_pynative_line
from alignflow.twin import logformats as fmt

# docs/mindformers.md#pynative-step-line (G3, wheel 2.1.0), without the optional throughput field
MF_G3 = ("{ step:[    1/ 1000], consumed_samples: 8, global_batch_size: 8, loss:  11.813965, per_step_time:  13570ms, "
         "load_balancing_loss:   1.093977, mtp_1_loss:  11.902344, lr: 1.000000e-05, grad_norm:  13.831877 }")
# docs/megatron.md#the-training_log-line, megatron-core 0.19.2 (verified line), seq_aux_loss run
MG_LINE = (" [2026-12-01 02:46:36.189042] iteration        1/       2 | consumed samples:            4 | elapsed time "
           "per iteration (ms): 1298.4 | learning rate: 1.000000E-04 | global batch size:     4 | lm loss: "
           "6.976211E+00 | load_balancing_loss: 0.000000E+00 | seq_load_balancing_loss: 1.022547E+00 | loss scale: "
           "1.0 | grad norm: 2.176 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def test_mindformers_g3_message() -> None:
    message = mindformers_pynative_line(
        1, 1000, consumed_samples=8, global_batch_size=8, loss=11.813965, step_time_ms=13570,
        load_balancing_loss=1.093977, mtp_losses=[11.902344], lr=1.0e-5, grad_norm=13.831877, prefix="none")
    assert message == MF_G3


def test_mindformers_message_without_moe_mtp_and_with_nan_norm() -> None:
    message = mindformers_pynative_line(
        3, 10, consumed_samples=12, global_batch_size=4, loss=5.0, step_time_ms=7,
        load_balancing_loss=None, mtp_losses=[], lr=1e-3, grad_norm=None, prefix="none")
    assert message == ("{ step:[    3/   10], consumed_samples: 12, global_batch_size: 4, loss:   5.000000, "
                       "per_step_time:      7ms, lr: 1.000000e-03, grad_norm: NaN }")


def test_mindformers_stdout_prefix() -> None:
    name = fmt.mindformers_logger_name({"LOG_MF_PATH": "/data/run01/output/log"})
    assert name == "mindformers/data/run01/output/log"
    formatter = fmt.MindFormersFormatter(name)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, MF_G3, None, None)
    record.site = "loss"
    line = formatter.format(record)
    assert line == (f"{formatter.formatTime(record)} - mindformers/data/run01/output/log"
                    f"[mindformers/pynative/callback/loss_callback.py:337] - INFO - {MF_G3}")
    assert formatter.formatTime(record)[19] == ","  # asctime: YYYY-MM-DD HH:MM:SS,mmm
    warning = logging.LogRecord("x", logging.WARNING, __file__, 1, "[SkipStepOnNaN] ...", None, None)
    warning.site = "nan"
    assert formatter.format(warning) == (f"{formatter.formatTime(warning)} - mindformers/data/run01/output/log"
                                         "[mindformers/pynative/trainer/trainer.py:1105] - WARNING - "
                                         "[SkipStepOnNaN] ...")


def test_mindformers_log_name_defaults_to_output_log() -> None:
    name = fmt.mindformers_logger_name({"LOCAL_DEFAULT_PATH": "/w/out"})
    assert name == "mindformers/w/out/log"


def test_megatron_training_log_line() -> None:
    line = megatron_line(
        1, 2, when=datetime(2026, 12, 1, 2, 46, 36, 189042), microseconds=True,
        consumed_samples=4, elapsed_ms=1298.4, lr=1e-4, global_batch_size=4,
        losses=dict([("lm loss", 6.976211), ("load_balancing_loss", 0.0), ("seq_load_balancing_loss", 1.022547)]),
        grad_norm=2.176, skipped=0, nan_iterations=0)
    assert line == MG_LINE


def test_megatron_before_016_prints_seconds_and_omits_negative_and_missing_values() -> None:
    line = megatron_line(
        7, 9, when=datetime(2025, 9, 5, 16, 8, 14, 999), microseconds=False,
        consumed_samples=28, elapsed_ms=3.14, lr=2.5e-4, global_batch_size=4, losses=dict([("lm loss", -1.0)]),
        grad_norm=None, skipped=1, nan_iterations=1)
    assert line.startswith(" [2025-09-05 16:08:14] iteration        7/       9 |")
    assert "lm loss" not in line
    assert "grad norm" not in line
    assert line.endswith("| number of skipped iterations:   1 | number of nan iterations:   1 |")


def test_megatron_checkpoint_lines() -> None:
    assert fmt.megatron_loading_line("/c", 10, release=False) == " loading checkpoint from /c at iteration 10"
    assert fmt.megatron_loaded_line("/c", 0) == (
        "  successfully loaded checkpoint from /c [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 0")
    assert fmt.megatron_padded_vocab_line(256, 256) == " > padded vocab (size: 256) with 0 dummy tokens (new size: 256)"


def test_report_memory_line_in_each_megatron_format(repo_root: Path) -> None:
    """core_v0.19 prints `{:.2f}` (the real H200 log's line, figure for figure); earlier releases `{}`."""
    real = (repo_root / "tests" / "data" / "logs" / "megatron_core_v0.19_h200.log").read_text().splitlines()
    line = fmt.megatron_memory_line(0, 1, allocated=78.4149, max_allocated=81.9612, reserved=100.0,
                                    max_reserved=100.0, two_decimals=True)
    assert line in real
    assert fmt.megatron_memory_line(3, 2, allocated=1.5, max_allocated=2.25, reserved=4.0, max_reserved=4.0) == (
        "[Rank 3] (after 2 iterations) memory (MB) | allocated: 1.5 | max allocated: 2.25 | reserved: 4.0 | "
        "max reserved: 4.0")
