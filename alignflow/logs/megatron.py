"""Megatron-family `training_log` lines and their sentinels: Megatron-LM, Megatron-DeepSpeed, ms-swift 3.x.

Format: docs/megatron.md#the-training_log-line (megatron-core 0.8 ... 0.19); Megatron-DeepSpeed prints the same fields
plus its own
(https://github.com/microsoft/Megatron-DeepSpeed/blob/main/megatron/training.py `training_log`; the BigScience fork
prints `elapsed time per iteration (s): {:.2f}`), ms-swift 3.x adds `memory(GiB)`, `elapsed time` and `remaining
time` text fields (https://github.com/modelscope/ms-swift/blob/v3.12.0/swift/megatron/trainers/base.py). Each
field is ` <name>: <value> |`; the line may start with a timestamp (seconds only before 0.16, microseconds since)
and, under torchrun `--tee`, a `[default0]:` prefix (stripped before this module sees the line). Parsing is
generic `key: value |` so new keys (`mtp_2 loss`, `seq_load_balancing_loss`) need no change; text values are not
tracked; validation and test-set lines do not match because they lack `iteration N/M`.

Semantics (docs/megatron.md#loss-semantics): `lm loss` is the token-weighted LM cross entropy; `<name> loss` and
`*_loss` keys are
printed `{:.6E}` and only when their average is >= 0, so a NaN loss shows up as a missing key plus a nonzero
`number of nan iterations` (Megatron-DeepSpeed and older Megatron-LM print a loss only when `avg > 0.0`, so a
fully skipped interval drops it too); a printed `grad norm: nan` is a diverged step; `grad norm` (pre-clip) and
`learning rate` are the last iteration's values. Since megatron-core 0.16 the line after a process's first one
also averages that first iteration in: each line keeps its timestamp kind (`StepLine.stamp`) as evidence of the
version, and `first_interval.py` undoes the averaging.
"""

from __future__ import annotations

import re

from alignflow.logs.lines import MAX_STEP, StepLine, snake
from alignflow.logs.sentinels import CHECKPOINT_LOADED, LineRule, Marker

_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|(.*)$")
# One ` <key>: <value> |` field; the second branch consumes a segment without a colon, so that a long or damaged
# line is scanned once (linear time), never retried from every position inside a segment.
_FIELD = re.compile(r"([^|:]*):([^|]*)\||[^|]*\|")
_MTP = re.compile(r"^mtp_(\d+) loss$")
# ` [2026-12-01 02:43:33.209317] iteration` (the anchor's prefix): group 1 is the microseconds, when printed.
_STAMP = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\]\s*$")
# `  successfully loaded checkpoint from <dir> [ t 1/1, ... ] at iteration 0`: the iteration training resumes after.
LOADED_AT = re.compile(r"successfully loaded checkpoint from .* at iteration\s+(\d+)")

# Printed name -> canonical column. Other `... loss` names become `<snake>_loss`; other keys their snake_case.
# Megatron-LM `training_log` (0.8-0.19), Megatron-DeepSpeed (microsoft and BigScience forks, `megatron/training.py`)
# and ms-swift 3.x (`swift/megatron/trainers/base.py`, a copy of `training_log` with memory and time fields).
COLUMNS: dict[str, str] = {
    "lm loss": "lm_loss",
    "grad norm": "grad_norm",
    "learning rate": "lr",
    "elapsed time per iteration (ms)": "step_time_ms",
    "elapsed time per iteration (s)": "step_time_s",  # BigScience Megatron-DeepSpeed `{:.2f}`: scaled to ms below
    "consumed samples": "consumed_samples",
    "consumed tokens": "consumed_tokens",
    "skipped samples": "skipped_samples",
    "global batch size": "global_batch_size",
    "loss scale": "loss_scale",
    "params norm": "params_norm",
    "num zeros": "num_zeros",
    "number of skipped iterations": "skipped",
    "number of nan iterations": "nan_iterations",
    "throughput per GPU (TFLOP/s/GPU)": "throughput_tflops",
    "TFLOPs": "throughput_tflops",  # Megatron-DeepSpeed: per-GPU TFLOP/s
    "samples per second": "samples_per_second",
    "tokens per gpu per second (tgs)": "tokens_per_gpu_per_second",
    "actual seqlen": "actual_seqlen",
    "curriculum seqlen": "curriculum_seqlen",
    "random ltd reserved length": "random_ltd_reserved_length",
    "memory(GiB)": "memory_gib",  # ms-swift
    "decoupled learning rate": "decoupled_lr",
    "energy per GPU (J/iter/GPU)": "energy_j_per_iter",
    "power per GPU (W/GPU)": "power_w",
}
# Columns printed in another unit than the canonical one: printed column -> (canonical column, factor).
UNITS: dict[str, tuple[str, float]] = {"step_time_s": ("step_time_ms", 1000.0)}
# Every column this format is known to print (a column close to one of these but not equal is reported).
KNOWN_COLUMNS = frozenset({
    *COLUMNS.values(), "load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss",
    "loss",
})
KNOWN_PATTERN = re.compile(r"^mtp_\d+_loss$")


def column_for(key: str) -> str:
    """Canonical column of a printed Megatron key (`mtp_1 loss` -> `mtp_1_loss`, `z_loss` -> `z_loss`)."""
    column = COLUMNS.get(key)
    if column is not None:
        return column
    m = _MTP.match(key)
    if m:
        return f"mtp_{m.group(1)}_loss"
    return snake(key)


def may_be_step_line(text: str) -> bool:
    """Cheap pre-check; `parse_step` decides."""
    return "iteration" in text and "|" in text


def step_of(text: str) -> int | None:
    """The iteration number of a step line, readable or not (None if it has no `iteration N/M |` anchor)."""
    m = _ITER.search(text)
    return None if m is None else int(m.group(1))


def is_step_line(text: str) -> bool:
    """Whether the line is an `iteration N/M |` line (readable or not)."""
    return may_be_step_line(text) and _ITER.search(text) is not None


def parse_step(text: str, with_resolution: bool = True) -> StepLine | str | None:
    """Parse one `training_log` line: None if it is no step line, a `str` saying why a step line is unreadable."""
    m = _ITER.search(text)
    if m is None:
        return None
    rest = m.group(3)
    if not rest.rstrip().endswith("|"):
        return "the line ends inside a field (every field ends with `|`)"
    pairs = _FIELD.findall(rest)
    cache = _COLUMN_CACHE
    try:  # fast path: every field `key: number`
        values = {(cache.get(k) or _learn(k)): float(t) for k, t in pairs}
    except ValueError:  # text fields (ms-swift's remaining time, RL packing info) are not tracked
        values = {}
        pairs = [(k, t) for k, t in pairs if k.strip() and t.strip()]
        for key, token in pairs:
            column = cache.get(key) or _learn(key)
            try:
                values[column] = float(token)
            except ValueError:
                continue
    if "step_time_s" in values:
        for printed, (column, factor) in UNITS.items():
            if printed in values:
                values[column] = values.pop(printed) * factor
    step, max_steps = int(m.group(1)), int(m.group(2))
    if step > MAX_STEP or max_steps > MAX_STEP:
        return f"iteration number out of range (more than {MAX_STEP})"
    stamp = _STAMP.search(text, 0, m.start())
    rec = StepLine(step=step, values=values, variant="megatron", max_steps=max_steps,
                   stamp="none" if stamp is None else "micro" if stamp.group(1) else "seconds")
    rec.check_finite()
    if with_resolution:
        for key, token in pairs:
            column = cache.get(key) or _learn(key)
            if column in values and values[column] - values[column] == 0.0:
                rec.set_resolution(column, token)
    return rec


_COLUMN_CACHE: dict[str, str] = {}
MAX_CACHED_KEYS = 4096


def _learn(key: str) -> str:
    column = column_for(key.strip()) or "unnamed_field"
    if len(_COLUMN_CACHE) < MAX_CACHED_KEYS:  # a damaged log must not grow the cache without bound
        _COLUMN_CACHE[key] = column
    return column

RULES: tuple[LineRule, ...] = (
    LineRule("megatron_nonstrict_load", "load_return:", True,
             "strict checkpoint load failed and Megatron fell back to a non-strict load: missing weights keep "
             "random values (keys are not printed)"),
    LineRule("megatron_checkpoint_unreadable", "could not load the checkpoint", True,
             "torch.load of the checkpoint failed; Megatron exits with code 0"),
    LineRule("megatron_no_checkpoint", "will not load any checkpoints", False,
             "no tracker file under --load: training started from random weights (fatal when a loaded checkpoint "
             "is required)", fatal_when=CHECKPOINT_LOADED),
    LineRule("megatron_exit_on_missing_checkpoint", "exit-on-missing-checkpoint", True,
             "--exit-on-missing-checkpoint fired: no checkpoint was loaded (exit code 0)",
             pattern=re.compile(r"exit-on-missing-checkpoint'?\s+set")),
    LineRule("megatron_invalid_tracker", "Invalid metadata file", True,
             "latest_checkpointed_iteration.txt is neither an integer nor `release`; Megatron exited (code 0)"),
    LineRule("megatron_size_mismatch", "size mismatch for", True,
             "a checkpoint tensor has the wrong shape"),
    LineRule("megatron_qkv_reordered", "successfully fixed query-key-values ordering", False,
             "checkpoint_version missing or old: Megatron touched QKV ordering"),
    LineRule("megatron_padded_vocab", "padded vocab", False,
             "vocabulary padded with dummy rows that enter the softmax and change lm loss",
             pattern=re.compile(r"padded vocab \(size: \d+\) with (\d+) dummy tokens"),
             when=lambda m: int(m.group(1)) > 0),
    # DeepSpeed (Megatron-DeepSpeed's engine): `runtime/fp16/fused_optimizer.py`, `unfused_optimizer.py`,
    # `loss_scaler.py` print one of these for each optimizer step an fp16 overflow skipped; `engine.py`
    # `_report_progress` prints `step={step}, skipped={self.skipped_steps}, lr=..., mom=...` (a running count).
    LineRule("deepspeed_overflow_skip", "Skipping step", False,
             "DeepSpeed skipped an optimizer step (fp16 loss-scale overflow)",
             pattern=re.compile(r"Overflow detected\. Skipping step|OVERFLOW! Rank \d+ Skipping step|"
                                r"loss scale overflow! Skipping step")),
    LineRule("deepspeed_skipped_steps", "skipped=", False, "DeepSpeed's count of skipped optimizer steps grew",
             pattern=re.compile(r"\bstep=\d+, skipped=(\d+), lr="), counter_group=1),
)

# `every=True`: each occurrence is kept, for finding where a (resumed) process starts training (first_interval.py).
MARKERS: tuple[Marker, ...] = (
    Marker("checkpoint_load_started", "loading checkpoint from"),
    Marker("checkpoint_load_started", "loading release checkpoint from"),
    Marker(CHECKPOINT_LOADED, "successfully loaded checkpoint from", every=True),
    Marker("training_started", "[before the start of training step]", every=True),  # print_datetime in train()
    Marker("training_started", "training ...", every=True),  # pretrain(): print_rank_0('training ...')
)
