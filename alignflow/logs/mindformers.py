"""MindFormers step lines (PyNative `LossCallback`, legacy `MFLossMonitor`) and MindFormers sentinels.

Formats: docs/mindformers.md#log-lines (three PyNative generations, the legacy line with sink mode on/off, the public
typo variants), and MindFormers 0.6's brace-less `Epoch:[..], step:[..], loss:[cur/avg], time:<ms> ms, lr:<x>`
(`OLD_ANCHOR`; 0.8-1.x already print the `{ Epoch:[` form). Rules followed here (docs/mindformers.md#parsing-rules):
anchor on
`{ step:[`, `{ Epoch:[` or `Epoch:[..], loss:` and ignore whatever logger prefix comes before; read `key: value`
pairs, never positions; accept `[x]`, `[a/b]` (take `a`), `N/A`, `None`, `NaN`, `inf`; drop lines whose loss is
`N/A` (non-last pipeline stage).

Semantics (docs/mindformers.md#what-each-logged-number-means): PyNative `loss` is the LM cross entropy only (= Megatron
`lm loss`); legacy `loss` is
the total (lm + aux + scaled MTP), its LM part is the separate `lm_loss` (or `loss` itself when no separate
losses are printed), and legacy `mtp_loss` is a scaled sum over depths, not comparable with Megatron's
per-depth `mtp_k loss`. Legacy global step = (epoch - 1) * steps_per_epoch + step.

Health monitor (1.6+ `TrainingStateMonitor`): a step skipped by `use_skip_data_by_global_norm` is named on its
`Current global norm .. of step N has been K consecutive times ..` line; its printed loss is not an update's, so
the step is left out of every statistic (`Sentinel.exclude_steps`); the `.. stop training` abort is fatal.
"""

from __future__ import annotations

import re

from alignflow.logs.lines import FLOAT32, MAX_STEP, NUM, StepLine, snake
from alignflow.logs.sentinels import CHECKPOINT_LOADED, LineRule, Marker

PYNATIVE_ANCHOR = "{ step:["
LEGACY_ANCHOR = "{ Epoch:["
# MindFormers 0.6 `MFLossMonitor.print_output_info` (no braces):
# "Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms, lr:%s, overflow cond: %s, loss_scale: %s"
# (https://github.com/mindspore-lab/mindformers/blob/r0.6/mindformers/core/callback/callback.py). The anchor
# needs `], loss:` so that TrainingStateMonitor's `Epoch:[..], step:[..] local_norm/...: 0.1` lines stay out.
OLD_ANCHOR = "], loss:"

# The line ends with its `}`; a wrapper after it (a note that put the line in parentheses or quotes) is no text.
_PYNATIVE = re.compile(r"\{ step:\[\s*(\d+)/\s*(\d+)\],(.*)\}[\s)\]\"'`.,;]*$")
_LEGACY = re.compile(r"\{ Epoch:\[\s*(\d+)/\s*(\d+)\], step:\[\s*(\d+)/\s*(\d+)\],(.*)$")
_OLD = re.compile(r"(?:^|[\s:(])[Ee]poch: ?\[\s*(\d+)/\s*(\d+)\], step: ?\[\s*(\d+)/\s*(\d+)\],( loss:.*)$")
# Brackets hold `[x]` or `[cur/avg]`; anything else inside (the public `[1 508834]` typo) is read leniently.
# The second branch consumes a run of key characters not followed by a value, so that a long or damaged line is
# scanned once (linear time) instead of from every position inside the run; a `[` value stops at the next `[`.
_KV = re.compile(r"([A-Za-z_][A-Za-z0-9_ ]*):\s*(\[[^\]\[]*\]|(?:" + NUM + r")|N/A|None|True|False)"
                 r"|[A-Za-z_][A-Za-z0-9_ ]*")
# The public `global_norm [10.579812]` variant has no colon.
_LENIENT_NORM = re.compile(r"global_norm:?\s*(\[[^\]\[]*\])")

# Printed name -> canonical column. Names not listed keep their own name (snake_case): new `*_loss` fields
# (`indexer_loss`, `mtp_3_loss`) need no change here.
PYNATIVE_COLUMNS: dict[str, str] = {
    "loss": "lm_loss",
    "per_step_time": "step_time_ms",
    "throughput": "throughput_tflops",
}
LEGACY_COLUMNS: dict[str, str] = {
    "loss": "total_loss",
    "mtp_loss": "mtp_loss_scaled_sum",
    "per_step_time": "step_time_ms",
    "global_norm": "grad_norm",
    "overflow cond": "overflow",
    "train_throughput_per_npu": "throughput_tflops",
    "time": "step_time_ms",  # 0.6: `time:%5.3f ms`
}
# Every column this format is known to print (a column close to one of these but not equal is reported).
KNOWN_COLUMNS = frozenset({
    *PYNATIVE_COLUMNS.values(), *LEGACY_COLUMNS.values(), "lm_loss", "lr", "grad_norm", "consumed_samples",
    "global_batch_size", "load_balancing_loss", "indexer_loss", "loss_scale",
})
KNOWN_PATTERN = re.compile(r"^mtp_\d+_loss$")
# Legacy `lr: %s` and `global_norm: %s` are str() of float32 numpy values: their digits vary, float32 does not.
LEGACY_FLOAT32 = frozenset({"lr", "grad_norm"})


def is_step_line(text: str) -> bool:
    """Whether the line carries a step anchor (`parse_step` then reads it or says why it cannot)."""
    return PYNATIVE_ANCHOR in text or LEGACY_ANCHOR in text or (OLD_ANCHOR in text and "poch:" in text)


def parse_step(text: str, with_resolution: bool = True) -> StepLine | str | None:
    """Parse one line holding a MindFormers step anchor; a `str` return is why it could not be read, None that
    the line is no step line after all.

    `with_resolution=False` skips reading each value's printed digits (the caller samples lines for that).
    """
    if LEGACY_ANCHOR in text:
        return _parse_legacy(text, with_resolution, _LEGACY, "legacy")
    if PYNATIVE_ANCHOR not in text:
        return _parse_legacy(text, with_resolution, _OLD, "legacy-0.6") if _OLD.search(text) else None
    m = _PYNATIVE.search(text)
    if m is None:
        return "a `{ step:[` line without its closing `}`"
    body = m.group(3)
    step, max_steps = int(m.group(1)), int(m.group(2))
    if step > MAX_STEP or max_steps > MAX_STEP:
        return "step number out of range"
    rec = StepLine(step=step, values={}, variant="", max_steps=max_steps)
    pairs = [kv for kv in _KV.findall(body) if kv[1]]
    cache = _PYNATIVE_CACHE
    try:  # fast path: a last-stage line whose values are all plain numbers (`NaN` included)
        rec.values = {(cache.get(k) or _learn(cache, PYNATIVE_COLUMNS, k)): float(t) for k, t in pairs}
    except ValueError:
        _read_pairs(pairs, cache, PYNATIVE_COLUMNS, frozenset(), rec, with_resolution)
    else:
        rec.check_finite()
        if with_resolution:
            for key, token in pairs:
                column = cache.get(key) or _learn(cache, PYNATIVE_COLUMNS, key)
                if rec.values[column] - rec.values[column] == 0.0:
                    rec.set_resolution(column, token)
    if "lm_loss" not in rec.values and not rec.not_last_stage:
        return "no readable `loss` value"
    rec.variant = "pynative-g3" if "consumed_samples:" in body else (
        "pynative-g2" if ("grad_norm:" in body or "throughput:" in body) else "pynative-g1")
    return rec


def _parse_legacy(text: str, with_resolution: bool, anchor: re.Pattern[str], variant: str) -> StepLine | str:
    m = anchor.search(text)
    if m is None:
        return "a `{ Epoch:[` line without `step:[n/m]`"
    epoch, epochs, step, per_epoch = (int(m.group(i)) for i in range(1, 5))
    if max(epoch, epochs, per_epoch) > 2**31 or step > MAX_STEP:
        return "epoch or step number out of range"
    body = m.group(5)
    # 1-based for now; `StepRecords.rebase_epochs` decides the bases from the whole log's counters (issue 33)
    rec = StepLine(step=(epoch - 1) * per_epoch + step, values={}, variant=variant, max_steps=epochs * per_epoch,
                   epoch=(epoch, step, per_epoch))
    pairs = [kv for kv in _KV.findall(body) if kv[1]]
    _read_pairs(pairs, _LEGACY_CACHE, LEGACY_COLUMNS, LEGACY_FLOAT32, rec, with_resolution)
    if "grad_norm" not in rec.values and "grad_norm" not in (rec.unreadable or ()) and "global_norm" in body:
        lenient = _LENIENT_NORM.search(body)
        if lenient is not None:
            _store(rec, "grad_norm", lenient.group(1), float32=True, with_resolution=with_resolution)
    if "total_loss" not in rec.values and not rec.not_last_stage:
        return "no readable `loss` value"
    if "lm_loss" not in rec.values and "total_loss" in rec.values:
        # No separate losses printed: the only loss is the LM loss (docs/mindformers.md#parsing-rules).
        rec.values["lm_loss"] = rec.values["total_loss"]
        if rec.resolutions and "total_loss" in rec.resolutions:
            rec.resolutions["lm_loss"] = rec.resolutions["total_loss"]
    return rec


MAX_CACHED_KEYS = 4096
_PYNATIVE_CACHE: dict[str, str] = {}
_LEGACY_CACHE: dict[str, str] = {}


def _learn(cache: dict[str, str], columns: dict[str, str], key: str) -> str:
    column = columns.get(key.strip()) or snake(key) or "unnamed_field"
    if len(cache) < MAX_CACHED_KEYS:  # a damaged log must not grow the cache without bound
        cache[key] = column
    return column


def _read_pairs(
    pairs: list[tuple[str, str]], cache: dict[str, str], columns: dict[str, str], float32: frozenset[str],
    rec: StepLine, with_resolution: bool,
) -> None:
    for key, token in pairs:
        column = cache.get(key) or _learn(cache, columns, key)
        if token == "N/A":
            if column in ("lm_loss", "total_loss"):
                rec.not_last_stage = True
            continue
        _store(rec, column, token, float32=column in float32, with_resolution=with_resolution)


def _store(rec: StepLine, column: str, token: str, *, float32: bool, with_resolution: bool) -> None:
    first = token[0]
    if first == "[":
        token = token[1:-1].split("/")[0].strip()
    elif first in "NTF" and token in ("None", "True", "False"):
        if token != "None":
            rec.values[column] = 1.0 if token == "True" else 0.0
        return
    try:
        value = float(token)
    except ValueError:
        rec.mark_unreadable(column)
        return
    rec.values[column] = value
    if value - value != 0.0:  # NaN or +-inf
        rec.mark_non_finite(column)
    elif with_resolution:
        if float32:
            rec.resolutions = rec.resolutions or {}
            rec.resolutions[column] = FLOAT32
        else:
            rec.set_resolution(column, token)


# Counters a checkpoint may hold that no network parameter matches (docs/mindformers.md#checkpoint-layout): harmless
# when unloaded.
_COUNTERS = frozenset({"tokens_per_expert", "global_tokens_per_expert", "ga_steps", "tid2eid"})

RULES: tuple[LineRule, ...] = (
    LineRule("mf_network_params_not_loaded", "Network parameters not loaded", True,
             "network parameters missing from the checkpoint (naming mismatch): they keep random values",
             lists_names=True),
    LineRule("mf_checkpoint_weights_not_loaded", "Checkpoint weights not loaded", True,
             "checkpoint tensors not consumed by the network", lists_names=True, benign_names=_COUNTERS),
    LineRule("mf_optimizer_not_loaded", "Optimizer parameters not loaded", False,
             "optimizer parameters not loaded (expected with no_load_optim)", lists_names=True),
    LineRule("mf_optimizer_not_loaded", "Optimizer weights not loaded", False,
             "optimizer weights not loaded (expected with no_load_optim)", lists_names=True),
    LineRule("mf_random_init", "Skipping checkpoint loading", False,
             "checkpoint path missing or empty: the model trained from random initialization (fatal when a loaded "
             "checkpoint is required)", fatal_when=CHECKPOINT_LOADED),
    LineRule("mf_common_json_missing", "Can not find 'common.json' file", True,
             "common.json missing next to the checkpoint: the load failed"),
    LineRule("mf_duplicate_parameter", "Duplicate parameter_name found", True,
             "the same tensor name is in two checkpoint files without metadata.json"),
    LineRule("mf_skip_step_on_nan", "[SkipStepOnNaN]", True,
             "optimizer update skipped on a NaN/inf gradient norm"),
    # TrainingStateMonitor.abnormal_global_norm_check (1.6+, mindformers/core/callback/callback.py): the health
    # monitor's abort (`check_for_global_norm`, or skip-data `global_norm_spike_count_threshold` reached) ...
    LineRule("mf_training_aborted", "stop training", True,
             "the global-norm health monitor stopped training (global norm above its threshold)",
             pattern=re.compile(r"greater (?:equal |or equal )?than threshold")),
    # ... a step whose data was skipped (`use_skip_data_by_global_norm`); its line prints a loss that is no update
    LineRule("mf_skipped_data", "consecutive times greater than threshold", False,
             "step skipped by use_skip_data_by_global_norm (global norm above skip_data_grad_norm_threshold): left "
             "out of the statistics", pattern=re.compile(r"of step (\d+) has been \d+ consecutive times"),
             step_group=1),
    LineRule("mf_skip_data", "is_skip:", False,
             "use_skip_data_by_global_norm skipped a step (global norm above skip_data_grad_norm_threshold)",
             pattern=re.compile(r"is_skip:\s*(?:\[\s*)?True")),
    LineRule("mf_global_norm_spike", "continue training", False,
             "global norm still above the health monitor's threshold after a restart",
             pattern=re.compile(r"is still greater or equal than threshold")),
)

MARKERS: tuple[Marker, ...] = (
    Marker("mf_pynative_start", "Running MindFormers in PYNATIVE_MODE."),
    Marker("mf_all_network_params_loaded", "All Network parameters are loaded."),
    Marker(CHECKPOINT_LOADED, "All Network parameters are loaded."),
    Marker("mf_all_checkpoint_weights_loaded", "All Checkpoint weights are loaded."),
)
