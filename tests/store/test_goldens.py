"""Matrix results and golden values in the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from alignflow.errors import ImmutableRecord, RecordNotFound, StoreError
from alignflow.store import Store
from alignflow.store.records import RunStatus
from tests.store.sample import CONFIG, CONFIG_SHA, SHA_B, SHA_C, run_params


def _run(store: Store, experiment: str = "demo") -> str:
    store.ensure_experiment(experiment, config=CONFIG, config_sha256=CONFIG_SHA)
    return store.create_run(experiment, trigger="cli", code_version="v", params=run_params(experiment)).id


def test_goldens_are_versioned_per_experiment_and_side_and_never_overwritten(store: Store) -> None:
    first, second = _run(store), _run(store)
    v1 = store.add_golden("demo", "gpu", run_id=first, step_run_id=None, log_sha256=SHA_B,
                          values={"metrics": {"lm_loss": {"1": 5.0}}}, note="first")
    store.add_golden("demo", "npu", run_id=first, step_run_id=None, log_sha256=SHA_B, values={"metrics": {}})
    v2 = store.add_golden("demo", "gpu", run_id=second, step_run_id=None, log_sha256=SHA_C,
                          values={"metrics": {"lm_loss": {"1": 5.1}}})
    assert (v1.version, v2.version) == (1, 2)
    newest = store.golden("demo", "gpu")
    assert newest is not None
    assert (newest.version, newest.run_id, newest.values["metrics"]["lm_loss"]["1"]) == (2, second, 5.1)
    assert [(g.side, g.version) for g in store.goldens("demo")] == [("gpu", 2), ("gpu", 1), ("npu", 1)]
    assert store.goldens("demo", "gpu")[1].note == "first"
    assert store.golden("demo", "tpu") is None
    assert store.golden_experiments() == ["demo"]


def test_a_golden_needs_a_known_experiment_and_run(store: Store) -> None:
    run = _run(store)
    with pytest.raises(RecordNotFound):
        store.add_golden("nope", "gpu", run_id=run, step_run_id=None, log_sha256=SHA_B, values={})
    with pytest.raises(StoreError, match="not a sha256"):
        store.add_golden("demo", "gpu", run_id=run, step_run_id=None, log_sha256="x", values={})


def test_a_matrix_result_is_recorded_once_while_its_run_is_open(store: Store) -> None:
    run = _run(store)
    assert store.matrix(run) is None
    record = store.add_matrix(run, verdict="pass", summary={"variants": [{"name": "01_a"}]}, report="/r/m.html")
    assert store.matrix(run) == record
    with pytest.raises(ImmutableRecord, match="already has a matrix result"):
        store.add_matrix(run, verdict="fail", summary={}, report=None)
    other = _run(store)
    store.finish_run(other, status=RunStatus.COMPLETED)
    with pytest.raises(ImmutableRecord):
        store.add_matrix(other, verdict="pass", summary={}, report=None)
