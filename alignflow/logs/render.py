"""The frameworks' own step-line format strings, for writers: the twin, tests and benchmarks.

Every line here is produced with the exact format strings of MindFormers 2.1.0 (`LossCallback._print_log`,
`MFLossMonitor`, `tools/logger.py`) and Megatron-LM `training_log()` as recorded in docs/mindformers.md#log-lines
and docs/megatron.md#the-training_log-line. So the twin's logs are byte-for-byte the shape production logs have, and
the parsers are tested on the formats they meet, not on a paraphrase. Pure: the clock is an argument. MindFormers'
legacy callback uses %-formatting; those strings are kept verbatim (hence the `noqa: UP031`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

import numpy as np

MindFormersPrefix = Literal["stdout", "info", "none"]
FIXED_TIME = datetime(2026, 8, 20, 10, 15, 2, 118000)
# `%(name)s` of the MindFormers logger is "mindformers" + the absolute log directory
# (docs/mindformers.md#logger-prefix).
DEFAULT_LOGGER_NAME = "mindformers/data/run01/output/log"
PYNATIVE_FILE = ("mindformers/pynative/callback/loss_callback.py", 337, "_print_log")
LEGACY_FILE = ("mindformers/core/callback/callback.py", 747, "print_output_info")
LEGACY_PROGRESS_FILE = ("mindformers/core/callback/callback.py", 764, "print_output_info")


def mindformers_prefix(
    message: str, *, prefix: MindFormersPrefix, when: datetime, caller: tuple[str, int, str],
    logger_name: str = DEFAULT_LOGGER_NAME,
) -> str:
    """Wrap a message the way MindFormers' stdout handler or its `info.log` file handler does."""
    asctime = when.strftime("%Y-%m-%d %H:%M:%S") + f",{when.microsecond // 1000:03d}"
    path, lineno, func = caller
    if prefix == "stdout":
        return f"{asctime} - {logger_name}[{path}:{lineno}] - INFO - {message}"
    if prefix == "info":
        return f"[INFO] {asctime} [{path}:{lineno}] {func}: {message}"
    return message


def mindformers_pynative_line(
    step: int, max_steps: int, *, loss: float | None, step_time_ms: int, lr: float | None = None,
    grad_norm: float | None = None, consumed_samples: int | None = None, global_batch_size: int | None = None,
    load_balancing_loss: float | None = None, indexer_loss: float | None = None, mtp_losses: Sequence[float] = (),
    throughput_tflops: float | None = None, generation: Literal[1, 2, 3] = 3, prefix: MindFormersPrefix = "stdout",
    when: datetime = FIXED_TIME,
) -> str:
    """A PyNative `LossCallback` line; `loss=None` renders a non-last pipeline stage (`loss: N/A ...`).

    Generation 1 (mindformers master, Jan 2026) pads nothing and prints only step, loss, time and lr;
    generation 2 (docs r2.10) pads with `%10.6f`/`%6d` and adds load balancing loss, grad norm, throughput;
    generation 3 (wheel 2.1.0) adds consumed samples, global batch size, indexer and MTP losses.
    """
    parts = [f"step:[{step:5d}/{max_steps:5d}]"]
    if generation >= 3:
        parts.append(f"consumed_samples: {consumed_samples}")
        parts.append(f"global_batch_size: {global_batch_size}")
    if loss is None:
        parts.append("loss: N/A (non-last PP stage, refer to last stage for real loss)")
        parts.append(f"per_step_time: {step_time_ms:6d}ms")
        return mindformers_prefix("{ " + ", ".join(parts) + " }", prefix=prefix, when=when, caller=PYNATIVE_FILE)
    if generation == 1:
        parts += [f"loss: {loss:.6f}", f"per_step_time: {step_time_ms}ms"]
        if lr is not None:
            parts.append(f"lr: {lr:.6e}")
        return mindformers_prefix("{ " + ", ".join(parts) + " }", prefix=prefix, when=when, caller=PYNATIVE_FILE)
    parts += [f"loss: {loss:10.6f}", f"per_step_time: {step_time_ms:6d}ms"]
    if load_balancing_loss is not None:
        parts.append(f"load_balancing_loss: {load_balancing_loss:10.6f}")
    if generation >= 3:
        if indexer_loss is not None:
            parts.append(f"indexer_loss: {indexer_loss:10.6f}")
        if mtp_losses:
            parts.append(", ".join(f"mtp_{k}_loss: {v:10.6f}" for k, v in enumerate(mtp_losses, 1)))
    if lr is not None:
        parts.append(f"lr: {lr:10.6e}")
    parts.append("grad_norm: NaN" if grad_norm is None else f"grad_norm: {grad_norm:10.6f}")
    if throughput_tflops is not None:
        parts.append(f"throughput: {throughput_tflops:6.2f}T")
    return mindformers_prefix("{ " + ", ".join(parts) + " }", prefix=prefix, when=when, caller=PYNATIVE_FILE)


def mindformers_legacy_line(
    epoch: int, epochs: int, step: int, steps_per_epoch: int, *, loss: float, step_time_ms: int,
    loss_avg: float | None = None, lm_loss: float | None = None, load_balancing_loss: float | None = None,
    mtp_loss: float | None = None, indexer_loss: float | None = None, lr: float | None = None,
    overflow: bool = False, loss_scale: str = "1.0", global_norm: float | None = None,
    throughput_tflops: float | None = None, loss_format: str = "%5.6f", prefix: MindFormersPrefix = "stdout",
    when: datetime = FIXED_TIME,
) -> str:
    """A legacy `MFLossMonitor` main line (graph mode). `loss_avg` given = sink mode off (`loss:[cur/avg]`).

    `lr` and `global_norm` are printed as str() of float32 numpy values, exactly as the callback does.
    `loss_format="%5.3f"` reproduces the older public logs.
    """
    if loss_avg is None:
        loss_info = f"loss: {loss_format % loss}, "
    else:
        loss_info = f"loss:[{loss_format % loss}/{loss_format % loss_avg}], "
    separate = ""
    if lm_loss is not None:
        separate += f"lm_loss: {lm_loss:5.6f}, "
    if load_balancing_loss is not None:
        separate += f"load_balancing_loss: {load_balancing_loss:5.6f}, "
    if mtp_loss is not None:
        separate += f"mtp_loss: {mtp_loss:5.6f}, "
    if indexer_loss is not None:
        separate += f"indexer_loss: {indexer_loss:5.6f}, "
    norm = "" if global_norm is None else str(np.array([global_norm], dtype=np.float32))
    throughput = "" if throughput_tflops is None else ", train_throughput_per_npu: %.3fT" % throughput_tflops  # noqa: UP031
    head = "{ Epoch:[%3d/%3d], step:[%5d/%5d], " % (epoch, epochs, step, steps_per_epoch)  # noqa: UP031
    head += loss_info + separate
    if lr is None:
        tail = "per_step_time: %dms, overflow cond: %s, loss_scale: %s, global_norm: %s%s" % (  # noqa: UP031
            step_time_ms, overflow, loss_scale, norm, throughput)
    else:
        tail = "per_step_time: %dms, lr: %s, overflow cond: %s, loss_scale: %s, global_norm: %s%s" % (  # noqa: UP031
            step_time_ms, str(np.float32(lr)), overflow, loss_scale, norm, throughput)
    return mindformers_prefix(head + tail, prefix=prefix, when=when, caller=LEGACY_FILE)


def mindformers_legacy_progress_line(
    percent: float, samples_per_s: float, remaining: str, *, prefix: MindFormersPrefix = "stdout",
    when: datetime = FIXED_TIME,
) -> str:
    """The progress line MFLossMonitor prints after each main line (closes the `{`)."""
    filled = int(percent / 2)
    bar = "|" + "█" * filled + " " * (50 - filled) + "|"
    message = "  %4.1f%% %s %.5f samples/s/p  %s }" % (percent, bar, samples_per_s, remaining)  # noqa: UP031
    return mindformers_prefix(message, prefix=prefix, when=when, caller=LEGACY_PROGRESS_FILE)


def megatron_line(
    iteration: int, train_iters: int, *, consumed_samples: int, elapsed_ms: float, lr: float | None,
    global_batch_size: int, losses: Mapping[str, float], grad_norm: float | None, loss_scale: float = 1.0,
    skipped: int = 0, nan_iterations: int = 0, throughput_tflops: float | None = None,
    params_norm: float | None = None, when: datetime | None = FIXED_TIME, microseconds: bool = True,
    rank_prefix: str = "",
) -> str:
    """A Megatron `training_log` line. `losses` keys are printed names (`lm loss`, `z_loss`, `mtp_1 loss`).

    Like Megatron, a loss whose value is negative or NaN is not printed. `when=None` omits the timestamp (as
    in the Megatron-Bridge docs); `microseconds=False` gives the 0.8-0.15 `[%Y-%m-%d %H:%M:%S]` form.
    """
    line = ""
    if when is not None:
        line += f" [{when.strftime('%Y-%m-%d %H:%M:%S.%f' if microseconds else '%Y-%m-%d %H:%M:%S')}]"
    line += f" iteration {iteration:8d}/{train_iters:8d} |"
    line += f" consumed samples: {consumed_samples:12d} |"
    line += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if throughput_tflops is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {throughput_tflops:.1f} |"
    if lr is not None:
        line += f" learning rate: {lr:.6E} |"
    line += f" global batch size: {global_batch_size:5d} |"
    for key, value in losses.items():
        if not math.isnan(value) and value >= 0:
            line += f" {key}: {value:.6E} |"
    line += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        line += f" grad norm: {grad_norm:.3f} |"
    if params_norm is not None:
        line += f" params norm: {params_norm:.3f} |"
    line += f" number of skipped iterations: {skipped:3d} |"
    line += f" number of nan iterations: {nan_iterations:3d} |"
    return rank_prefix + line
