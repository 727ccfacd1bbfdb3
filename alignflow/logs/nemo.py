"""NeMo 2 (Lightning) step lines: `ProgressPrinter` in `nemo/lightning/pytorch/callbacks/progress_printer.py`.

Format (https://github.com/NVIDIA/NeMo/blob/main/nemo/lightning/pytorch/callbacks/progress_printer.py):
`print(prefix + "".join(f" | {metric}: {val}"))` with `prefix = "Training epoch {epoch}, iteration {n-1}/{total-1}"`,
each value printed `int(val)` when it is a whole float and `f"{val:.4}"` otherwise (4 significant digits, so
`1.5e-05`, `11.03`, `nan`). The metrics are whatever the strategy and callbacks log: `reduced_train_loss` (the
token-averaged LM loss, `MegatronStrategy.training_step`), `lr`, `global_step` (the trainer's step before this
optimizer step, skipped from averaging), `consumed_samples`, `train_step_timing in s` (TimingCallback), ...
The other metrics are averaged over the print interval (`average_metrics_dict`).

Steps: `global_step + 1` when printed (the 1-based count of optimizer steps, as Megatron's `iteration`), else the
printed 0-based iteration + 1. Validation lines (`Validation: iteration 1/10`) carry no metrics and are not steps.
"""

from __future__ import annotations

import re

from alignflow.logs.lines import MAX_STEP, StepLine, snake
from alignflow.logs.schema import Resolution

ANCHOR = "Training epoch "
_HEAD = re.compile(r"Training epoch (\d+), iteration (\d+)/(\d+)")

# Printed metric -> canonical column (others keep their snake_case name).
COLUMNS: dict[str, str] = {
    "reduced_train_loss": "lm_loss",
    "lr": "lr",
    "global_step": "global_step",
    "consumed_samples": "consumed_samples",
    "global_batch_size": "global_batch_size",
    "train_step_timing in s": "step_time_s",
    "max_memory_reserved": "max_memory_reserved",
    "max_memory_allocated": "max_memory_allocated",
}
UNITS: dict[str, tuple[str, float]] = {"step_time_s": ("step_time_ms", 1000.0)}
KNOWN_COLUMNS = frozenset({*COLUMNS.values(), "step_time_ms"})
# `f"{val:.4}"`: four significant digits whatever the digits shown (`1.5e-05` is 1.500e-05).
SIGNIFICANT_4 = Resolution("significant", 3)

_CACHE: dict[str, str] = {}


def is_step_line(text: str) -> bool:
    """Cheap pre-check; `parse_step` decides."""
    return ANCHOR in text and ", iteration " in text


def parse_step(text: str, with_resolution: bool = True) -> StepLine | str | None:
    """Parse one `ProgressPrinter` training line: None if it is none, a `str` saying why it is unreadable."""
    m = _HEAD.search(text)
    if m is None:
        return None
    rest = text[m.end():].rstrip()
    if rest and not rest.startswith(" | "):
        return "a NeMo 2 progress line whose fields are not ` | name: value`"
    values: dict[str, float] = {}
    for field in rest.split(" | ")[1:]:
        key, sep, token = field.partition(": ")
        if not sep:
            return f"field {field.strip()[:60]!r} is not `name: value` (a cut or damaged line)"
        column = _CACHE.get(key) or _learn(key)
        try:
            values[column] = float(token)
        except ValueError:
            continue
    for printed, (column, factor) in UNITS.items():
        if printed in values:
            values[column] = values.pop(printed) * factor
    iteration, last = int(m.group(2)), int(m.group(3))
    global_step = values.get("global_step")
    step = int(global_step) + 1 if global_step is not None and global_step - global_step == 0.0 else iteration + 1
    if step > MAX_STEP or last >= MAX_STEP or step < 1:
        return "step number out of range"
    rec = StepLine(step=step, values=values, variant="nemo2", max_steps=last + 1)
    rec.check_finite()
    if with_resolution:
        rec.resolutions = {c: SIGNIFICANT_4 for c, v in values.items() if v - v == 0.0 and not v.is_integer()}
    return rec


def _learn(key: str) -> str:
    column = COLUMNS.get(key.strip()) or snake(key) or "unnamed_field"
    if len(_CACHE) < 4096:  # a damaged log must not grow the cache without bound
        _CACHE[key] = column
    return column
