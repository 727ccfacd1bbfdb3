"""`alignflow reproduce`'s judgement of a differing training log: bookkeeping columns are not a divergence."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from alignflow.logs import parse_log
from alignflow.logs.schema import BOOKKEEPING_COLUMNS
from alignflow.runner.reproduce import _log_note
from tests.logfixtures import make_run, megatron_lines


@dataclass(frozen=True)
class _StepRun:
    id: str
    run_id: str
    reused_from: str | None = None


class _Store:
    """Just enough of the store for `_log_note`: each run's metrics as the engine records them (long rows)."""

    def __init__(self, frames: dict[str, pd.DataFrame]) -> None:
        self._frames = frames

    def metrics(self, run_id: str) -> pd.DataFrame:
        wide = self._frames[run_id].copy()
        wide.index.name = "step"
        long = wide.reset_index().melt(id_vars="step", var_name="metric", value_name="value")
        long["step_run_id"] = f"sr-{run_id}"
        return long.astype({"value": "float64"})

    def get_step(self, step_run_id: str) -> Any:  # pragma: no cover - no step here is cached
        raise AssertionError(step_run_id)


def _parsed(run: Any) -> pd.DataFrame:
    return parse_log([line.rstrip("\n") for line in megatron_lines(run)], fmt="megatron").frame


def _note(a: pd.DataFrame, b: pd.DataFrame) -> tuple[str, bool]:
    store = _Store({"a": a, "b": b})
    return _log_note(store, _StepRun("sr-a", "a"), _StepRun("sr-b", "b"))


def test_logs_differing_only_in_timings_and_sample_counters_are_timing_only() -> None:
    run = make_run(6, step_time_ms=700.0)
    a = _parsed(run)
    b = _parsed(replace(run, step_time_ms=[t * 1.7 for t in run.step_time_ms], global_batch_size=16))
    differing = {c for c in a.columns if not a[c].equals(b[c])}
    # the two logs really differ, in canonical bookkeeping columns only
    assert {"step_time_ms", "consumed_samples", "global_batch_size"} <= differing <= BOOKKEEPING_COLUMNS
    assert "throughput_tflops" in BOOKKEEPING_COLUMNS
    note, substantive = _note(a, b)
    assert substantive is False
    assert note.startswith("timing only"), note


def test_a_differing_loss_is_substantive() -> None:
    run = make_run(6)
    a = _parsed(run)
    b = _parsed(replace(run, lm_loss=[v + 0.01 for v in run.lm_loss],
                        step_time_ms=[t + 3.0 for t in run.step_time_ms]))
    note, substantive = _note(a, b)
    assert substantive is True
    assert note.startswith("logged metrics differ: "), note
    assert "lm_loss" in note, note
    assert "step_time_ms" not in note
