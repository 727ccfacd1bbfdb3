"""The twin's log lines that `alignflow.logs.render` does not write: the MindFormers logging prefix as a
`logging.Formatter`, and Megatron's vocabulary and checkpoint lines. The step lines themselves come from
`alignflow.logs.render` (`mindformers_pynative_line(prefix="none")`, `megatron_line`), the same format strings
the parsers are tested on.

MindFormers 2.1.0 PyNative (docs/mindformers.md#log-lines): the stdout logger prefix
`%(asctime)s - %(name)s[%(filepath)s:%(lineno)d] - %(levelname)s - %(message)s`, where the logger name is
`"mindformers" + <absolute log dir>` and file/line are the calling MindFormers module's, and the G3
`LossCallback` message `{ step:[    1/ 1000], consumed_samples: 8, ... }`.

Megatron-LM `training_log` (docs/megatron.md#the-training_log-line): one line per iteration starting with a space and
the timestamp (microseconds since megatron-core 0.16, seconds before), then ` <name>: <value> |` fields. And the
legacy checkpoint lines (docs/megatron.md#what-the-loader-needs-under-finetune,
docs/megatron.md#strict-load-and-the-silent-fallback, docs/megatron.md#log-sentinels).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import datetime

from alignflow.logs.render import mindformers_prefix

_INFO = " - INFO - "  # the level render's prefix writes; the formatter writes the record's own

# ---------------------------------------------------------------------------------------------- MindFormers

# Call sites whose file:line the prefix names, as real MindFormers 2.1.0 prints them (tests/data/mindformers_2.1.0/
# holds the lab's real logs; tests/twin/test_fidelity.py checks these against them).
MF_SITES: dict[str, tuple[str, int]] = {
    "loss": ("mindformers/pynative/callback/loss_callback.py", 337),
    "trainer": ("mindformers/pynative/trainer/trainer.py", 490),
    "start": ("mindformers/pynative/trainer/trainer.py", 1353),
    "resume": ("mindformers/pynative/trainer/trainer.py", 1308),
    "load": ("mindformers/checkpoint/checkpoint.py", 867),
    "load_detail": ("mindformers/checkpoint/checkpoint.py", 870),
    "load_detail_name": ("mindformers/checkpoint/checkpoint.py", 872),
    "save": ("mindformers/pynative/callback/checkpoint_callback.py", 260),
    "nan": ("mindformers/pynative/trainer/trainer.py", 1105),
}


def mindformers_logger_name(env: Mapping[str, str]) -> str:
    """`"mindformers" + get_log_path()`: `LOG_MF_PATH`, else `realpath(LOCAL_DEFAULT_PATH or ./output)/log`."""
    log_path = env.get("LOG_MF_PATH") or os.path.join(os.path.realpath(env.get("LOCAL_DEFAULT_PATH", "./output")),
                                                      "log")
    return "mindformers" + log_path


class MindFormersFormatter(logging.Formatter):
    """Formats records with the MindFormers stdout prefix (`alignflow.logs.render.mindformers_prefix`) and the
    record's level; `extra={"site": key}` picks the file:line."""

    def __init__(self, logger_name: str) -> None:
        super().__init__()
        self.logger_name = logger_name

    def format(self, record: logging.LogRecord) -> str:
        path, lineno = MF_SITES.get(getattr(record, "site", "trainer"), MF_SITES["trainer"])
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        # `asctime` as logging's formatTime makes it: local time of `created`, milliseconds from `msecs`
        when = datetime.fromtimestamp(int(record.created)).replace(microsecond=int(record.msecs) * 1000)
        head = mindformers_prefix("", prefix="stdout", when=when, caller=(path, lineno, ""),
                                  logger_name=self.logger_name)
        return head.removesuffix(_INFO) + f" - {record.levelname} - " + message


def mindformers_resume_message(*, local_batch_size: int, consumed_samples: int, global_step: int) -> str:
    """`Trainer._load_checkpoint` on a full resume (static batch): the data skip it applies."""
    return (f"Resume dataset (static batch): skip {consumed_samples // local_batch_size} micro-batches "
            f"(consumed_samples={consumed_samples}, global_step={global_step}).")


def mindformers_saved_message(step: int, save_path: str) -> str:
    """`CheckpointCallback` after a synchronous save."""
    return f"Checkpoint saved at step {step} to {save_path} (async=False, remove_redundancy=False)"


def mindformers_nan_message(grad_norm: float, step: int) -> str:
    return f"[SkipStepOnNaN] Global gradient norm is {grad_norm} at step {step}, skipping the optimizer update."


# ---------------------------------------------------------------------------------------------- Megatron

MEGATRON_RANKS = "[ t 1/1, gtp_remat 1/1, p 1/1 ]"


def megatron_ranks(tp: int = 1, pp: int = 1) -> str:
    """Rank 0's `[ t 1/TP, gtp_remat 1/1, p 1/PP ]` (`print_rank_0` of `load_checkpoint` / `save_checkpoint`)."""
    return f"[ t 1/{tp}, gtp_remat 1/1, p 1/{pp} ]"


def megatron_timestamp(now: datetime, *, microseconds: bool) -> str:
    return now.strftime("%Y-%m-%d %H:%M:%S.%f" if microseconds else "%Y-%m-%d %H:%M:%S")


def megatron_memory_line(rank: int, iteration: int, *, allocated: float, max_allocated: float, reserved: float,
                         max_reserved: float, two_decimals: bool = False) -> str:
    """Megatron-LM's `report_memory(f'(after {iteration} iterations)')`, `[Rank N]` the global rank: MiB figures
    printed with `str.format`'s `{}` (no rounding; megatron/training/utils.py up to core_v0.18) or, with
    `two_decimals`, `{:.2f}` (core_v0.19's utils/common_utils.py; docs/megatron.md#memory-report-line)."""
    figures = [f"{v:.2f}" if two_decimals else f"{v}" for v in (allocated, max_allocated, reserved, max_reserved)]
    return (f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: {figures[0]} | max allocated: "
            f"{figures[1]} | reserved: {figures[2]} | max reserved: {figures[3]}")


def megatron_padded_vocab_line(orig: int, padded: int) -> str:
    return f" > padded vocab (size: {orig}) with {padded - orig} dummy tokens (new size: {padded})"


def megatron_loading_line(load_dir: str, iteration: int, *, release: bool, distributed: bool = False) -> str:
    infix = "distributed " if distributed else ""  # `dist_infix` of `_load_base_checkpoint`
    if release:
        return f" loading release {infix}checkpoint from {load_dir}"
    return f" loading {infix}checkpoint from {load_dir} at iteration {iteration}"


def megatron_loaded_line(load_dir: str, iteration: int, *, tp: int = 1, pp: int = 1) -> str:
    return f"  successfully loaded checkpoint from {load_dir} {megatron_ranks(tp, pp)} at iteration {iteration}"


def megatron_saving_line(now: datetime, save_dir: str, iteration: int, *, microseconds: bool) -> str:
    ts = megatron_timestamp(now, microseconds=microseconds)
    return f"[{ts}] saving checkpoint at iteration {iteration:7d} to {save_dir} in torch format"


def megatron_saved_line(save_dir: str, iteration: int) -> str:
    return f"  successfully saved checkpoint from iteration {iteration:7d} to {save_dir} {MEGATRON_RANKS}"


MEGATRON_NO_ARGS_LINE = "could not find arguments in the checkpoint ..."
MEGATRON_LOAD_RETURN_LINE = "load_return: None"
