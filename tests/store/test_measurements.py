"""Snapshots, per-step metrics and comparisons (SQLite and PostgreSQL)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from alignflow.errors import ImmutableRecord, StoreError
from alignflow.store import Store
from tests.store.sample import CONFIG, CONFIG_SHA, run_params


def _run(store: Store) -> str:
    store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    return store.create_run("demo", trigger="cli", code_version="v", params=run_params()).id


def _log_frame() -> pd.DataFrame:
    """What a log parser returns: indexed by step, canonical columns, NaN where a value was printed as nan."""
    frame = pd.DataFrame(
        {
            "lm_loss": [10.832155, 10.826517, float("nan"), 10.79],
            "grad_norm": [5.123, 4.987, float("inf"), 4.5],
            "lr": [1e-5, 2e-5, 3e-5, 4e-5],
            "skipped": [False, False, True, False],
        },
        index=pd.Index([1, 2, 3, 4], name="step"),
    )
    return frame


def test_snapshots_round_trip_per_host(store: Store) -> None:
    run_id = _run(store)
    npu = store.add_snapshot(run_id, "npu-a", {"mindspore": "2.10.0", "repos": {"mindformers": {"commit": "ab12",
                                                                                             "dirty": False}}})
    gpu = store.add_snapshot(run_id, "gpu-a", {"torch": "2.13.0", "env": {"NCCL_ALGO": "Ring"}})
    assert store.snapshots(run_id) == [npu, gpu]
    assert npu.data["repos"]["mindformers"]["commit"] == "ab12"
    assert npu.taken_at.tzinfo is not None


def test_metrics_round_trip_keeps_nan_and_inf(store: Store) -> None:
    run_id = _run(store)
    frame = _log_frame()
    assert store.add_metrics(run_id, source="npu", frame=frame) == 16
    wide = store.metrics(run_id, "npu", wide=True)
    expected = frame.astype("float64")[sorted(frame.columns)]
    pd.testing.assert_frame_equal(wide, expected, check_names=False, check_index_type=False)
    assert wide.index.name == "step"
    assert math.isnan(wide.loc[3, "lm_loss"])
    assert wide.loc[3, "grad_norm"] == float("inf")


def test_metrics_long_format_lists_every_source(store: Store) -> None:
    run_id = _run(store)
    step_id = store.start_step(run_id, "compare", host="ctl", command="compare", cache_key="k", inputs={}).id
    store.add_metrics(run_id, source="npu", frame=_log_frame()[["lm_loss"]])
    gpu = pd.DataFrame({"step": [1, 2], "lm_loss": [10.83, 10.82]})  # a `step` column works as well
    assert store.add_metrics(run_id, source="gpu", frame=gpu, step_run_id=step_id) == 2
    long = store.metrics(run_id)
    assert list(long.columns) == ["source", "step_run_id", "step", "metric", "value"]
    assert list(long["source"]) == ["gpu", "gpu", "npu", "npu", "npu", "npu"]
    assert list(long["step_run_id"][:2]) == [step_id, step_id]
    assert long["step"].dtype == "int64"
    assert long["value"].dtype == "float64"
    only_gpu = store.metrics(run_id, "gpu")
    assert list(only_gpu["value"]) == [10.83, 10.82]


def test_metrics_of_a_source_are_recorded_once(store: Store) -> None:
    run_id = _run(store)
    store.add_metrics(run_id, source="npu", frame=_log_frame())
    with pytest.raises(ImmutableRecord, match="already has metrics from source 'npu'"):
        store.add_metrics(run_id, source="npu", frame=_log_frame())
    assert len(store.metrics(run_id)) == 16


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"lm_loss": [1.0, 2.0], "note": ["a", "b"]}), r"columns \['note'\] are not numeric"),
        (pd.DataFrame({"lm_loss": [1.0, 2.0]}, index=[1, 1]), r"duplicate steps \[1\]"),
        (pd.DataFrame({"lm_loss": [1.0]}, index=["one"]), "the step index must hold integers"),
        ([1, 2, 3], "expected a pandas DataFrame, got list"),
    ],
)
def test_frames_that_are_not_metrics_are_refused(store: Store, frame: object, message: str) -> None:
    run_id = _run(store)
    with pytest.raises(StoreError, match=message):
        store.add_metrics(run_id, source="npu", frame=frame)  # type: ignore[arg-type]
    assert store.metrics(run_id).empty


def test_wide_metrics_need_a_source(store: Store) -> None:
    with pytest.raises(ValueError, match="needs a source"):
        store.metrics(_run(store), wide=True)


def test_comparison_is_recorded_once_per_run(store: Store) -> None:
    run_id = _run(store)
    assert store.comparison(run_id) is None
    criteria = [{"label": "|me(lm_loss)| < 0.001", "value": np.float64(0.0004), "passed": True}]
    summary = {"lm_loss": {"mean_rel": 0.0002, "steps": 100}, "excluded_steps": [2]}
    record = store.add_comparison(run_id, verdict="pass", criteria=criteria, summary=summary)
    assert record.passed
    assert store.comparison(run_id) == record
    assert record.criteria[0]["value"] == 0.0004
    with pytest.raises(ImmutableRecord, match="already has a comparison"):
        store.add_comparison(run_id, verdict="fail", criteria=[], summary={})
    assert store.comparison(run_id) == record


def test_a_comparison_with_nan_in_its_summary_names_the_key(store: Store) -> None:
    run_id = _run(store)
    with pytest.raises(StoreError, match=r"summary\['grad_norm'\]\['max_rel'\]: inf cannot be stored in JSON"):
        store.add_comparison(run_id, verdict="fail", criteria=[], summary={"grad_norm": {"max_rel": float("inf")}})
    assert store.comparison(run_id) is None


def test_measurements_cannot_be_added_to_a_finished_run(store: Store) -> None:
    run_id = _run(store)
    store.finish_run(run_id, status="completed", verdict="pass")
    with pytest.raises(ImmutableRecord):
        store.add_metrics(run_id, source="npu", frame=_log_frame())
    with pytest.raises(ImmutableRecord):
        store.add_comparison(run_id, verdict="pass", criteria=[], summary={})
    assert store.metrics(run_id).empty
    assert store.comparison(run_id) is None
