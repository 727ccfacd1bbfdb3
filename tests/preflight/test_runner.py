"""Preflight before step 1 in the plain-Python walk (`execute_pipeline`, the flow's equivalent without Prefect):
a mismatch fails the run with the mismatch list as its error, and no step runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from alignflow.runner.run import execute_pipeline, start_run
from alignflow.store import Store
from alignflow.transport import open_transport
from tests.recipes.copies import copy_twin

EVERY_STEP = ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare")


def local_hosts(root: Path) -> Path:
    path = root / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {
        name: {"role": name, "transport": "local", "workdir": f"hosts/{name}"} for name in ("ascend", "cpu", "cuda")}}))
    return path


def test_a_mismatch_fails_the_run_before_anything_runs(repo_root: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")])))
    experiment = copy_twin(repo_root, tmp_path, edits={"gpu.extra_args": ["--hidden-dropout", "0.1"]})
    state = tmp_path / "state"
    with Store.open(state_dir=state) as store:
        run_id = start_run(experiment, local_hosts(tmp_path), store=store, state_dir=state)
        record = execute_pipeline(run_id, store=store, state_dir=state, transport_factory=open_transport)
        steps = store.steps(run_id)
    assert (record.status, record.verdict) == ("error", None)  # a configuration error, not a failed alignment
    assert (record.error or "").startswith("preflight: 1 of ")
    assert "hidden dropout: NPU 0 (model.model_config.hidden_dropout) vs GPU 0.1 (--hidden-dropout)" in (record.error
                                                                                                          or "")
    assert {s.step: s.status for s in steps} == dict.fromkeys(EVERY_STEP, "skipped")
    assert all(s.job_dir is None and s.started_at is None for s in steps)
    assert not (tmp_path / "data" / "tiny").exists()  # not even the data was generated
    report = json.loads((state / "runs" / run_id / "preflight.json").read_text())
    assert report["ok"] is False
    assert [f["setting"] for f in report["findings"] if f["status"] == "mismatch"] == ["model.hidden_dropout"]


def test_an_experiment_that_turns_preflight_off_is_run_unchecked_and_says_so(
    repo_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from alignflow.runner.run import preflight_run
    from alignflow.runner.session import open_run

    edits = {"gpu.extra_args": ["--hidden-dropout", "0.1"], "preflight": False}
    experiment = copy_twin(repo_root, tmp_path, edits=edits)
    state = tmp_path / "state"
    with Store.open(state_dir=state) as store, caplog.at_level("WARNING"):
        run_id = start_run(experiment, local_hosts(tmp_path), store=store, state_dir=state)
        assert preflight_run(open_run(store, run_id), state_dir=state) is None  # the mismatch is not looked at
    assert "settings were NOT compared" in caplog.text
    assert not (state / "runs" / run_id / "preflight.json").exists()
