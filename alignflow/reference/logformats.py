"""The exact log lines of the real frameworks, as pure functions (the twin prints what alignflow parses).

MindFormers 2.1.0 PyNative (mindformers reference §2.1-2.2): the stdout logger prefix
`%(asctime)s - %(name)s[%(filepath)s:%(lineno)d] - %(levelname)s - %(message)s`, where the logger name is
`"mindformers" + <absolute log dir>` and file/line are the calling MindFormers module's, and the G3
`LossCallback` message `{ step:[    1/ 1000], consumed_samples: 8, ... }`.

Megatron-LM `training_log` (megatron reference §2.1): one line per iteration starting with a space and the
timestamp (microseconds since megatron-core 0.16, seconds before), then ` <name>: <value> |` fields. And the
legacy checkpoint lines (§3.3, §5, §6).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from datetime import datetime

# ---------------------------------------------------------------------------------------------- MindFormers

MF_STDOUT_FORMAT = "%(asctime)s - %(mf_name)s[%(mf_file)s:%(mf_line)d] - %(levelname)s - %(message)s"
# Call sites whose file:line the prefix names. The LossCallback line is exact (loss_callback.py:337); the
# checkpoint ones sit in the ranges the reference gives (checkpoint.py:865-927, utils.py:681-712).
MF_SITES: dict[str, tuple[str, int]] = {
    "loss": ("mindformers/pynative/callback/loss_callback.py", 337),
    "trainer": ("mindformers/pynative/trainer/trainer.py", 490),
    "load": ("mindformers/checkpoint/checkpoint.py", 905),
    "load_detail": ("mindformers/checkpoint/utils.py", 695),
    "save": ("mindformers/pynative/callback/checkpoint_callback.py", 180),
    "nan": ("mindformers/pynative/trainer/trainer.py", 1105),
}


def mindformers_logger_name(env: Mapping[str, str]) -> str:
    """`"mindformers" + get_log_path()`: `LOG_MF_PATH`, else `realpath(LOCAL_DEFAULT_PATH or ./output)/log`."""
    log_path = env.get("LOG_MF_PATH") or os.path.join(os.path.realpath(env.get("LOCAL_DEFAULT_PATH", "./output")),
                                                      "log")
    return "mindformers" + log_path


class MindFormersFormatter(logging.Formatter):
    """Formats records with the MindFormers stdout prefix; `extra={"site": key}` picks the file:line."""

    def __init__(self, logger_name: str) -> None:
        super().__init__(MF_STDOUT_FORMAT)
        self.logger_name = logger_name

    def format(self, record: logging.LogRecord) -> str:
        site = MF_SITES.get(getattr(record, "site", "trainer"), MF_SITES["trainer"])
        record.mf_name = self.logger_name
        record.mf_file, record.mf_line = site
        return super().format(record)


def mindformers_step_message(
    *,
    step: int,
    max_steps: int,
    consumed_samples: int,
    global_batch_size: int,
    loss: float,
    step_time_ms: int,
    load_balancing_loss: float | None,
    mtp_losses: Sequence[float],
    lr: float,
    grad_norm: float | None,
) -> str:
    """The G3 PyNative `LossCallback._print_log` message (mindformers §2.2), throughput omitted."""
    parts = [
        f"step:[{step:5d}/{max_steps:5d}]",
        f"consumed_samples: {consumed_samples}",
        f"global_batch_size: {global_batch_size}",
        f"loss: {loss:10.6f}",
        f"per_step_time: {step_time_ms:6d}ms",
    ]
    if load_balancing_loss is not None:
        parts.append(f"load_balancing_loss: {load_balancing_loss:10.6f}")
    if mtp_losses:
        parts.append(", ".join(f"mtp_{k}_loss: {v:10.6f}" for k, v in enumerate(mtp_losses, start=1)))
    parts.append(f"lr: {lr:10.6e}")
    parts.append("grad_norm: NaN" if grad_norm is None else f"grad_norm: {grad_norm:10.6f}")
    return "{ " + ", ".join(parts) + " }"


def mindformers_nan_message(grad_norm: float, step: int) -> str:
    return f"[SkipStepOnNaN] Global gradient norm is {grad_norm} at step {step}, skipping the optimizer update."


# ---------------------------------------------------------------------------------------------- Megatron

MEGATRON_RANKS = "[ t 1/1, gtp_remat 1/1, p 1/1 ]"


def megatron_timestamp(now: datetime, *, microseconds: bool) -> str:
    return now.strftime("%Y-%m-%d %H:%M:%S.%f" if microseconds else "%Y-%m-%d %H:%M:%S")


def megatron_iteration_line(
    *,
    now: datetime,
    microseconds: bool,
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    elapsed_ms: float,
    lr: float,
    global_batch_size: int,
    losses: Sequence[tuple[str, float]],
    grad_norm: float | None,
    skipped_iterations: int,
    nan_iterations: int,
    loss_scale: float = 1.0,
) -> str:
    """Megatron `training_log` line (megatron §2.1); `losses` in `total_loss_dict` order."""
    line = f" [{megatron_timestamp(now, microseconds=microseconds)}]"
    line += f" iteration {iteration:8d}/{train_iters:8d} |"
    line += f" consumed samples: {consumed_samples:12d} |"
    line += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    line += f" learning rate: {lr:.6E} |"
    line += f" global batch size: {global_batch_size:5d} |"
    for name, value in losses:
        if value >= 0.0:  # Megatron prints a loss key only when its average is not negative
            line += f" {name}: {value:.6E} |"
    line += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        line += f" grad norm: {grad_norm:.3f} |"
    line += f" number of skipped iterations: {skipped_iterations:3d} |"
    line += f" number of nan iterations: {nan_iterations:3d} |"
    return line


def megatron_padded_vocab_line(orig: int, padded: int) -> str:
    return f" > padded vocab (size: {orig}) with {padded - orig} dummy tokens (new size: {padded})"


def megatron_loading_line(load_dir: str, iteration: int, *, release: bool) -> str:
    if release:
        return f" loading release checkpoint from {load_dir}"
    return f" loading checkpoint from {load_dir} at iteration {iteration}"


def megatron_loaded_line(load_dir: str, iteration: int) -> str:
    return f"  successfully loaded checkpoint from {load_dir} {MEGATRON_RANKS} at iteration {iteration}"


def megatron_saving_line(now: datetime, save_dir: str, iteration: int, *, microseconds: bool) -> str:
    ts = megatron_timestamp(now, microseconds=microseconds)
    return f"[{ts}] saving checkpoint at iteration {iteration:7d} to {save_dir} in torch format"


def megatron_saved_line(save_dir: str, iteration: int) -> str:
    return f"  successfully saved checkpoint from iteration {iteration:7d} to {save_dir} {MEGATRON_RANKS}"


MEGATRON_NO_ARGS_LINE = "could not find arguments in the checkpoint ..."
MEGATRON_LOAD_RETURN_LINE = "load_return: None"
