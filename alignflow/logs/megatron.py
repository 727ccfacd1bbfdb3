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
# One ` <key>: <value> |` field; the second branch consumes a run of segments without a colon, so that a long or
# damaged line is scanned once (linear time), never retried from every position inside a segment, and the run is one
# empty pair (a pasted line of a million `|` was a million pairs: 64 MiB for a 1 MB line).
_FIELD = re.compile(r"([^|:]*):([^|]*)\||(?:[^|:]*+\|)++")
_MTP = re.compile(r"^mtp_(\d+) loss$")
# The timestamp right before the `iteration` anchor: megatron-core's own ` [%Y-%m-%d %H:%M:%S.%f]` (0.16+) or
# ` [%Y-%m-%d %H:%M:%S]`, or an RFC 3339 one (`[2025-10-21T16:18:53+08:00]`, `2025-10-21T08:18:53.123Z`, what a fork
# or a log collector prints instead), bracketed or not: group 1 is the fraction of a second, when printed.
_STAMP = re.compile(r"(?:\[\s*|^|\s)\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,](\d+))?(?:Z|[+-]\d\d(?::?\d\d)?)?"
                    r"(?:\s*\])?\s*$")
# What a line may end with after its last field that is no text of its own: a wrapper (a note that put each line
# in parentheses or quotes) or trailing punctuation.
_WRAPPER_CHARS = " \t)]}>\"'`.,;"
_WRAPPER_TAIL = re.compile(r"^[\s)\]}>\"'`.,;]*$")
# A key cut by the line's end (`grad n`): letters, spaces and the characters keys are made of, no colon.
_CUT_KEY = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_ ()/-]*$")
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
# The printed format of the fields `training_log` prints (docs/megatron.md#the-training_log-line), as a test of a
# whole value: a value at the end of a line that lost its closing `|` is read only when it passes (`2.35` cut from
# `2.354123E+00` does not). Losses and learning rates are `{:.6E}` (`{:.3E}` before core 0.8); integers are padded
# to a width (`{:3d}`), so a value cut on the left of its padding is shorter than it.
_SCI = re.compile(r"^[-+]?\d\.\d{3,}E[-+]\d{2,}$|^[-+]?(?:nan|inf)$", re.I)
_FIXED = {1: re.compile(r"^[-+]?\d+\.\d$"), 3: re.compile(r"^[-+]?\d+\.\d{3}$|^[-+]?(?:nan|inf)$", re.I)}
WHOLE: dict[str, tuple[str, int]] = {  # column -> ("sci" | "fixed" | "int", decimals or width)
    "lr": ("sci", 0), "decoupled_lr": ("sci", 0), "grad_norm": ("fixed", 3), "params_norm": ("fixed", 3),
    "loss_scale": ("fixed", 1), "step_time_ms": ("fixed", 1), "throughput_tflops": ("fixed", 1),
    "consumed_samples": ("int", 12), "global_batch_size": ("int", 5), "skipped": ("int", 3),
    "nan_iterations": ("int", 3),
}


def is_whole(column: str, token: str) -> bool:
    """Whether `token` (the text after `key:`) is a whole value of `column` as `training_log` prints it."""
    kind, n = ("sci", 0) if column.endswith("_loss") or column == "loss" else WHOLE.get(column, ("", 0))
    value = token.strip()
    if kind == "sci":
        return _SCI.match(value) is not None
    if kind == "fixed":
        return _FIXED[n].match(value) is not None
    if kind == "int":
        return value.isdigit() and len(token.rstrip()) >= n + 1  # ` {:3d}`: a space, then at least n characters
    return False


def is_numeric(column: str) -> bool:
    """Whether `training_log` prints `column` as a number (a text there is a damaged value, not a text field)."""
    return column in WHOLE or column.endswith("_loss") or column == "loss" or column in _NUMERIC_OTHERS


_NUMERIC_OTHERS = frozenset({"step_time_s", "consumed_tokens", "skipped_samples", "num_zeros", "samples_per_second",
                             "tokens_per_gpu_per_second", "actual_seqlen", "curriculum_seqlen", "memory_gib",
                             "energy_j_per_iter", "power_w"})


# Loss keys megatron-core prints besides `lm loss` (MoE auxiliary losses, `total_loss_dict` keys).
_LOSS_KEYS = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss")
# Fields printed with a text value (ms-swift 3.x `elapsed time: 12s | remaining time: 6h 51m 18s`): not tracked,
# but a line cut or wrapped inside one is still a step line cut inside a field.
TEXT_KEYS = ("elapsed time", "remaining time")
# Columns printed in another unit than the canonical one: printed column -> (canonical column, factor).
UNITS: dict[str, tuple[str, float]] = {"step_time_s": ("step_time_ms", 1000.0)}
# Every column this format is known to print (a column close to one of these but not equal is reported).
KNOWN_COLUMNS = frozenset({*COLUMNS.values(), *_LOSS_KEYS, "loss"})
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
    """Parse one `training_log` line: None if it is no step line, a `str` saying why a step line is unreadable.

    Every field closed by its `|` is read. What follows the last `|` is (issue 33): nothing; a wrapper (`)`);
    the last field without its `|` (copied or cut logs), read only when its value is whole (`is_whole`); a field
    cut by the line's end (`StepLine.cut`: the next physical line may continue it); or text another process printed
    onto the line (`StepLine.glued`, scanned for sentinels by the caller). What was not read is noted
    (`StepLine.not_read`); a closed field of a numeric column whose value is no number is damage
    (`StepLine.damaged`).
    """
    m = _ITER.search(text)
    if m is None:
        return None
    rest = m.group(3)
    again = _ITER.search(rest)  # a second step line glued onto this one: this one ends before it
    glued_line = ""
    if again is not None:
        before = rest[:again.start()]
        stamp = _STAMP.search(before)
        cut_at = stamp.start() if stamp is not None else again.start()
        rest, glued_line = rest[:cut_at], rest[cut_at:]
    last = rest.rfind("|")
    body, tail = rest[:last + 1], rest[last + 1:]
    pairs = _FIELD.findall(body)
    cache = _COLUMN_CACHE
    damaged: list[tuple[str, str]] = []
    try:  # fast path: every field `key: number`
        values = {(cache.get(k) or _learn(k)): float(t) for k, t in pairs}
    except ValueError:  # text fields (ms-swift's remaining time, RL packing info) are not tracked
        pairs, values, damaged = _read_text_fields(pairs)
    step, max_steps = int(m.group(1)), int(m.group(2))
    if step > MAX_STEP or max_steps > MAX_STEP:
        return f"iteration number out of range (more than {MAX_STEP})"
    stamp = _STAMP.search(text, 0, m.start())
    rec = StepLine(step=step, values=values, variant="megatron", max_steps=max_steps,
                   stamp="none" if stamp is None else "micro" if stamp.group(1) else "seconds")
    for column, token in damaged:
        rec.mark_damaged(column, token)
    _read_tail(rec, tail, pairs)
    if glued_line:
        rec.note_not_read(f"not read: another step line glued after the last field (`{glued_line.strip()[:60]}`)")
        rec.glued = (rec.glued + " " if rec.glued else "") + glued_line
    if not rec.values and not rec.damaged:
        return "the line ends before its first field"
    if "step_time_s" in rec.values:
        for printed, (column, factor) in UNITS.items():
            if printed in rec.values:
                rec.values[column] = rec.values.pop(printed) * factor
    rec.check_finite()
    if with_resolution:
        _note_resolution(rec, pairs)
    return rec


def _read_text_fields(pairs: list[tuple[str, str]]
                      ) -> tuple[list[tuple[str, str]], dict[str, float], list[tuple[str, str]]]:
    """The fields of a step line some of whose values are no number (the slow path of `parse_step`): the pairs
    kept (empty keys and values dropped), the numbers by canonical column, and the numeric columns whose value is
    no number (damage); text columns are not tracked."""
    pairs = [(k, t) for k, t in pairs if k.strip() and t.strip()]
    values: dict[str, float] = {}
    damaged: list[tuple[str, str]] = []
    for key, token in pairs:
        column = _COLUMN_CACHE.get(key) or _learn(key)
        try:
            values[column] = float(token)
        except ValueError:
            if is_numeric(column):
                damaged.append((column, token))
    return pairs, values, damaged


def _note_resolution(rec: StepLine, pairs: list[tuple[str, str]]) -> None:
    """The printed resolution of each finite value, from its token as printed."""
    cache = _COLUMN_CACHE
    for key, token in pairs:
        column = cache.get(key) or _learn(key)
        if column in rec.values and rec.values[column] - rec.values[column] == 0.0:
            rec.set_resolution(column, token)


def _read_tail(rec: StepLine, tail: str, pairs: list[tuple[str, str]]) -> None:
    """What follows the last `|` (see `parse_step`)."""
    if _WRAPPER_TAIL.match(tail):
        return
    shown = tail.strip()[:60]
    key, colon, token = tail.partition(":")
    if colon and key.strip() and "|" not in token and _CUT_KEY.match(key):
        column = _COLUMN_CACHE.get(key) or _learn(key)
        value = token.rstrip(_WRAPPER_CHARS)
        if column not in rec.values and value.strip() and is_whole(column, value):
            rec.values[column] = float(value)
            pairs.append((key, value.strip()))
            return
        if is_numeric(column) or _known(column) or key.strip() in TEXT_KEYS:
            rec.cut = True
            rec.note_not_read(f"not read: `{shown}`: the line ends inside this field (no closing `|`; its value may "
                              "be cut)")
            return
    elif not colon and _is_key_prefix(tail):
        rec.cut = True
        rec.note_not_read(f"not read: `{shown}`: the line ends inside a field name")
        return
    rec.glued = tail
    rec.note_not_read(f"not read: text after the last field that is no field of this line (another process's output "
                      f"glued to it?): `{shown}`")


def _is_key_prefix(fragment: str) -> bool:
    """Whether `fragment` is the start of a key this format prints (`grad n`, `number of sk`, `mtp_2 lo`)."""
    start = fragment.strip()
    if not start or _CUT_KEY.match(fragment) is None:
        return False
    return (any(key.startswith(start) for key in (*COLUMNS, *_LOSS_KEYS, *TEXT_KEYS))
            or _MTP_START.match(start) is not None)


_MTP_START = re.compile(r"^mtp_\d* ?l?o?s?$")


def continues(line: str, text: str, cut: bool) -> str | None:
    """The step line `line` joined with `text`, the physical line after it, when `text` continues it (a document
    that wrapped the line); else None.

    `cut` (the line ends inside a field): `text` must close that field with `|` before anything else. A wrap breaks
    anywhere, a field name included (`grad n` / `orm: 1.234 |`); where it broke at a space the space may be gone,
    so the join keeps the one that gives a key this format prints. Otherwise (the line ends at a field's `|`):
    `text` must be nothing but fields this format prints that the line lacks (so Megatron's memory report,
    `[Rank 0] (after 10 iterations) memory (MB) | allocated: ...`, is never taken for the rest of a step line).
    """
    if _ITER.search(text) is not None or "|" not in text:
        return None
    if cut:
        head = text[:text.index("|")]
        if not head.strip():  # wrapped right before the field's `|`: the field was whole
            return line + text
        if len(head) > 200:
            return None
        broken = line[line.rfind("|") + 1:]
        for sep in ("", " "):
            key = (broken + sep + head).partition(":")[0].strip()
            if ":" in broken + sep + head and (_known(column_for(key)) or key in TEXT_KEYS):
                return line + sep + text
        return line + text if ":" in broken + head else None
    body = text.strip()
    if not line.rstrip().endswith("|") and not body.startswith("|"):
        return None  # a wrap loses at most a space, never the `|` between two fields
    joined = line.rstrip() + " " + body
    body = body[1:] if body.startswith("|") else body
    end = body.rfind("|")
    if end < 0:
        return None
    fields = _FIELD.findall(body[:end + 1])  # (after the last `|`: a wrapper, or glued text `parse_step` reports)
    if not fields or any(not key.strip() for key, _ in fields):
        return None
    columns = [column_for(key.strip()) for key, _ in fields]
    anchor = _ITER.search(line)
    mine = _FIELD.findall(anchor.group(3)[:anchor.group(3).rfind("|") + 1]) if anchor is not None else []
    present = {column_for(key.strip()) for key, _ in mine if key.strip()}
    if present and not all(_known(c) or key.strip() in TEXT_KEYS  # (a line with no field of its own takes any)
                           for c, (key, _) in zip(columns, fields, strict=True)):
        return None
    return None if present & set(columns) else joined


def _known(column: str) -> bool:
    return column in KNOWN_COLUMNS or KNOWN_PATTERN.match(column) is not None


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
