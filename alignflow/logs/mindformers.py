"""MindFormers step lines (PyNative `LossCallback`, legacy `MFLossMonitor`) and MindFormers sentinels.

Formats: MindFormers reference §2 (three PyNative generations, the legacy line with sink mode on/off, the public
typo variants). Rules followed here (reference §2.5): anchor on `{ step:[` or `{ Epoch:[` and ignore whatever
logger prefix comes before; read `key: value` pairs, never positions; accept `[x]`, `[a/b]` (take `a`), `N/A`,
`None`, `NaN`, `inf`; drop lines whose loss is `N/A` (non-last pipeline stage).

Semantics (reference §3): PyNative `loss` is the LM cross entropy only (= Megatron `lm loss`); legacy `loss` is
the total (lm + aux + scaled MTP), its LM part is the separate `lm_loss` (or `loss` itself when no separate
losses are printed), and legacy `mtp_loss` is a scaled sum over depths, not comparable with Megatron's
per-depth `mtp_k loss`. Legacy global step = (epoch - 1) * steps_per_epoch + step.
"""

from __future__ import annotations

import re

from alignflow.logs.lines import FLOAT32, NUM, StepLine, snake
from alignflow.logs.sentinels import LineRule, Marker

PYNATIVE_ANCHOR = "{ step:["
LEGACY_ANCHOR = "{ Epoch:["

_PYNATIVE = re.compile(r"\{ step:\[\s*(\d+)/\s*(\d+)\],(.*)\}\s*$")
_LEGACY = re.compile(r"\{ Epoch:\[\s*(\d+)/\s*(\d+)\], step:\[\s*(\d+)/\s*(\d+)\],(.*)$")
# Brackets hold `[x]` or `[cur/avg]`; anything else inside (the public `[1 508834]` typo) is read leniently.
_KV = re.compile(r"([A-Za-z_][A-Za-z0-9_ ]*?):\s*(\[[^\]]*\]|(?:" + NUM + r")|N/A|None|True|False)")
# The public `global_norm [10.579812]` variant has no colon.
_LENIENT_NORM = re.compile(r"global_norm:?\s*(\[[^\]]*\])")

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
}
# Legacy `lr: %s` and `global_norm: %s` are str() of float32 numpy values: their digits vary, float32 does not.
LEGACY_FLOAT32 = frozenset({"lr", "grad_norm"})


def is_step_line(text: str) -> bool:
    """Whether the line carries a step anchor (`parse_step` then reads it or says why it cannot)."""
    return PYNATIVE_ANCHOR in text or LEGACY_ANCHOR in text


def parse_step(text: str, *, with_resolution: bool = True) -> StepLine | str:
    """Parse one line holding a MindFormers step anchor; a `str` return is why it could not be read.

    `with_resolution=False` skips reading each value's printed digits (the caller samples lines for that).
    """
    if LEGACY_ANCHOR in text:
        return _parse_legacy(text, with_resolution)
    m = _PYNATIVE.search(text)
    if m is None:
        return "a `{ step:[` line without its closing `}`"
    body = m.group(3)
    rec = StepLine(step=int(m.group(1)), values={}, variant="", max_steps=int(m.group(2)))
    pairs = _KV.findall(body)
    cache = _PYNATIVE_CACHE
    try:  # fast path: a last-stage line whose values are all plain numbers (`NaN` included)
        rec.values = {(cache.get(k) or _learn(cache, PYNATIVE_COLUMNS, k)): float(t) for k, t in pairs}
    except ValueError:
        _read_pairs(pairs, cache, PYNATIVE_COLUMNS, frozenset(), rec, with_resolution)
    else:
        rec.check_finite()
        if with_resolution:
            for key, token in pairs:
                column = cache[key]
                if rec.values[column] - rec.values[column] == 0.0:
                    rec.set_resolution(column, token)
    if "lm_loss" not in rec.values and not rec.not_last_stage:
        return "no readable `loss` value"
    rec.variant = "pynative-g3" if "consumed_samples:" in body else (
        "pynative-g2" if ("grad_norm:" in body or "throughput:" in body) else "pynative-g1")
    return rec


def _parse_legacy(text: str, with_resolution: bool) -> StepLine | str:
    m = _LEGACY.search(text)
    if m is None:
        return "a `{ Epoch:[` line without `step:[n/m]`"
    epoch, epochs, step, per_epoch = (int(m.group(i)) for i in range(1, 5))
    body = m.group(5)
    rec = StepLine(step=(epoch - 1) * per_epoch + step, values={}, variant="legacy", max_steps=epochs * per_epoch)
    _read_pairs(_KV.findall(body), _LEGACY_CACHE, LEGACY_COLUMNS, LEGACY_FLOAT32, rec, with_resolution)
    if "grad_norm" not in rec.values and "grad_norm" not in (rec.unreadable or ()) and "global_norm" in body:
        lenient = _LENIENT_NORM.search(body)
        if lenient is not None:
            _store(rec, "grad_norm", lenient.group(1), float32=True, with_resolution=with_resolution)
    if "total_loss" not in rec.values and not rec.not_last_stage:
        return "no readable `loss` value"
    if "lm_loss" not in rec.values and "total_loss" in rec.values:
        # No separate losses printed: the only loss is the LM loss (reference §2.5).
        rec.values["lm_loss"] = rec.values["total_loss"]
        if rec.resolutions and "total_loss" in rec.resolutions:
            rec.resolutions["lm_loss"] = rec.resolutions["total_loss"]
    return rec


_PYNATIVE_CACHE: dict[str, str] = {}
_LEGACY_CACHE: dict[str, str] = {}


def _learn(cache: dict[str, str], columns: dict[str, str], key: str) -> str:
    column = cache[key] = columns.get(key.strip()) or snake(key)
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


# Counters a checkpoint may hold that no network parameter matches (reference §4.1): harmless when unloaded.
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
    LineRule("mf_random_init", "Skipping checkpoint loading", True,
             "checkpoint path missing or empty: the model trained from random initialization"),
    LineRule("mf_common_json_missing", "Can not find 'common.json' file", True,
             "common.json missing next to the checkpoint: the load failed"),
    LineRule("mf_duplicate_parameter", "Duplicate parameter_name found", True,
             "the same tensor name is in two checkpoint files without metadata.json"),
    LineRule("mf_skip_step_on_nan", "[SkipStepOnNaN]", True,
             "optimizer update skipped on a NaN/inf gradient norm"),
)

MARKERS: tuple[Marker, ...] = (
    Marker("mf_pynative_start", "Running MindFormers in PYNATIVE_MODE."),
    Marker("mf_all_network_params_loaded", "All Network parameters are loaded."),
    Marker("mf_all_checkpoint_weights_loaded", "All Checkpoint weights are loaded."),
)
