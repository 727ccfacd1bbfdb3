"""The renderers reproduce the references' example lines byte for byte, so logs written with them are real-format."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from alignflow.logs.render import (
    megatron_line,
    mindformers_legacy_line,
    mindformers_legacy_progress_line,
    mindformers_pynative_line,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "logs"


def _golden(file: str, name: str) -> str:
    for case in json.loads((DATA / file).read_text(encoding="utf-8")):
        if case["name"] == name:
            return str(case["line"])
    raise KeyError(name)


def test_pynative_generations_match_the_reference_lines() -> None:
    g1 = mindformers_pynative_line(1, 10, loss=11.813965, step_time_ms=13570, lr=1e-05, generation=1, prefix="none")
    assert g1 == _golden("mindformers_lines.json", "pynative G1 (mindformers master, no prefix)")
    g2 = mindformers_pynative_line(1, 10, loss=11.813965, step_time_ms=13570, lr=1e-05, grad_norm=13.831877,
                                   load_balancing_loss=1.093977, throughput_tflops=1.36, generation=2, prefix="none")
    assert g2 == _golden("mindformers_lines.json", "pynative G2 (docs r2.10, no prefix)")
    kwargs = dict(loss=11.813965, step_time_ms=13570, lr=1e-05, grad_norm=13.831877, consumed_samples=8,
                  global_batch_size=8, load_balancing_loss=1.093977, mtp_losses=[11.902344], throughput_tflops=1.36)
    stdout = mindformers_pynative_line(1, 1000, prefix="stdout", **kwargs)  # type: ignore[arg-type]
    assert stdout == _golden("mindformers_lines.json", "pynative G3, stdout prefix (msrun worker log)")
    info = mindformers_pynative_line(1, 1000, prefix="info", **kwargs)  # type: ignore[arg-type]
    assert info == _golden("mindformers_lines.json", "pynative G3, info.log prefix")
    na = mindformers_pynative_line(3, 1000, loss=None, step_time_ms=702,
                                   when=datetime(2026, 8, 20, 10, 15, 3, 951000))
    assert na == _golden("mindformers_lines.json", "pynative G3, non-last pipeline stage")


def test_legacy_lines_match_the_reference_lines() -> None:
    sink = mindformers_legacy_line(1, 1, 1, 1000, loss=15.401078, lm_loss=11.813965, load_balancing_loss=1.093977,
                                   mtp_loss=3.570703, step_time_ms=13570, lr=1e-05, global_norm=13.831877,
                                   throughput_tflops=1.36)
    assert sink == _golden("mindformers_lines.json", "legacy, sink mode, separate losses (MoE + MTP)")
    no_sink = mindformers_legacy_line(1, 2, 5, 19, loss=8.867123, loss_avg=9.821004, step_time_ms=1758,
                                      lr=9.8386645e-06, global_norm=16.986555,
                                      when=datetime(2026, 8, 20, 10, 15, 3, 951000))
    assert no_sink == _golden("mindformers_lines.json",
                              "legacy, sink mode off (loss:[cur/avg]), dense, epoch 1 of 2")
    progress = mindformers_legacy_progress_line(0.1, 0.58953, "3:45:56")
    assert progress.endswith("INFO -    0.1% |" + " " * 50 + "| 0.58953 samples/s/p  3:45:56 }")
    assert "callback.py:764" in progress


def test_megatron_lines_match_the_reference_lines() -> None:
    dense = megatron_line(1, 3, consumed_samples=4, elapsed_ms=670.2, throughput_tflops=0.0, lr=1e-4,
                          global_batch_size=4, losses={"lm loss": 6.966832}, grad_norm=2.290, params_norm=45.815,
                          when=datetime(2026, 12, 1, 2, 43, 33, 209317))
    assert dense == _golden("megatron_lines.json", "0.19.2 dense, --log-throughput --log-params-norm")
    moe = megatron_line(1, 3, consumed_samples=4, elapsed_ms=935.6, throughput_tflops=0.0, lr=1e-4,
                        global_batch_size=4, grad_norm=2.192, when=datetime(2026, 12, 1, 2, 45, 17, 959035),
                        losses={"lm loss": 6.993355, "load_balancing_loss": 1.024174, "z_loss": 1.894531,
                                "mtp_1 loss": 6.999038})
    assert moe == _golden("megatron_lines.json", "0.19.2 MoE (aux_loss + z-loss) with MTP")
    old = megatron_line(1, 2000, consumed_samples=128, elapsed_ms=79489.9, throughput_tflops=18.0, lr=2.999998e-05,
                        global_batch_size=128, grad_norm=0.258, when=datetime(2025, 9, 5, 16, 8, 14),
                        microseconds=False,
                        losses={"lm loss": 2.605958, "z_loss": 10.91659, "mtp_1 loss": 2.828435})
    assert old == _golden("megatron_lines.json", "0.13/0.14 era, seconds-only timestamp")
    tee = megatron_line(1, 3, consumed_samples=4, elapsed_ms=670.2, throughput_tflops=0.0, lr=1e-4,
                        global_batch_size=4, losses={"lm loss": 6.966832}, grad_norm=2.290, params_norm=45.815,
                        when=datetime(2026, 12, 1, 2, 43, 33, 209317), rank_prefix="[default0]:")
    assert tee == _golden("megatron_lines.json", "torchrun --tee prefix [default0]:")


def test_megatron_omits_a_nan_loss_like_megatron_does() -> None:
    line = megatron_line(5, 10, consumed_samples=20, elapsed_ms=1.0, lr=1e-4, global_batch_size=4,
                         losses={"lm loss": float("nan"), "z_loss": 1.5}, grad_norm=None, nan_iterations=1)
    assert "lm loss" not in line
    assert "grad norm" not in line
    assert "z_loss: 1.500000E+00 |" in line
    assert "number of nan iterations:   1 |" in line
