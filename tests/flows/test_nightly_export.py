"""The nightly's export policy: a failed export fails the nightly, after every experiment has run and been exported.

The experiments' trainings are the alignment flow's and are tested with it (tests/flows/test_alignment.py, and the
team test's nightly, which exports four real runs). Here each experiment's run is a run recorded as the pipeline
records one (tests/recorded_run.py), so that the test is about what the nightly does with exports: the real
TensorBoard writer, the real store, a real Prefect flow run and its final state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect import flow
from prefect.states import Completed

import flows.nightly as nightly
from alignflow.config.catalog import NightlyExport
from alignflow.regression import DriftPolicy
from tasks.context import close_stores
from tests.recorded_run import record_run

pytestmark = pytest.mark.integration


def test_a_failed_export_fails_the_nightly_after_every_experiment_ran(
        prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = record_run(tmp_path / "run", loss_offset=0.0)
    monkeypatch.setenv("ALIGNFLOW_DB_URL", recorded.url)
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(tmp_path / "state"))
    close_stores()
    started: list[str] = []

    def start_run(experiment: str, hosts: str, options: Any) -> str:
        started.append(experiment)
        return recorded.run_id

    monkeypatch.setattr(nightly, "start_run_task", start_run)
    monkeypatch.setattr(nightly, "alignment", lambda **_: Completed())
    # Both experiments name the same recorded run: the first export writes it, the second is refused ("was already
    # exported there"), as a second export of one run to one TensorBoard dir is.
    export = NightlyExport(tensorboard=str(tmp_path / "tb"))

    @flow(name="nightly-export-test")
    def nightly_under_test() -> Any:
        return nightly.run_nightly([("first", Path("first.yaml")), ("second", Path("second.yaml")),
                                    ("third", Path("third.yaml"))], Path("hosts.yaml"), DriftPolicy(), export)

    try:
        state = nightly_under_test(return_state=True)
    finally:
        close_stores()
    assert started == ["first.yaml", "second.yaml", "third.yaml"]  # the failure did not stop the experiments after it
    assert state.is_failed()
    assert state.name == nightly.EXPORT_FAILED
    message = state.message or ""
    assert f"second: export of run {recorded.run_id} failed" in message
    assert f"third: export of run {recorded.run_id} failed" in message
    assert "first: export" not in message
    assert (tmp_path / "tb" / recorded.run_id).is_dir()  # the first export is there
