"""The Prefect states and names a run ends with (issue 19), built from the run's record; no Prefect server."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from alignflow.errors import AlignflowError
from alignflow.runner.session import RunOptions, StepOutcome
from alignflow.runview import CriterionView, RunView
from alignflow.store.records import StepStatus
from flows.states import NOT_ALIGNED, NotAligned, flow_run_name, run_state
from tasks.steps import step_state

CRITERION = CriterionView(label="|me(lm_loss)| < 0.001", value=2.3e-3, value_text="+2.3e-03", threshold_text="0.001",
                          passed=False, first_outside=4, driving_steps=(4, 5), note="", source="")


def view(**changes: Any) -> RunView:
    base: dict[str, Any] = dict(
        run_id="0123456789ab", experiment="demo", status="completed", verdict="pass", trigger="deployment",
        parent_id=None, code_version="alignflow 0.1.0", started=datetime(2026, 1, 1, tzinfo=UTC), finished=None,
        duration_s=None, error=None, report=None, steps=(), criteria=(), snapshots={})
    return RunView(**{**base, **changes})


def test_pass_completes_and_its_result_is_the_record() -> None:
    state = run_state(view(criteria=(CRITERION.model_copy(update={"passed": True, "driving_steps": ()}),)))
    assert (state.type.value, state.name) == ("COMPLETED", "Completed")
    assert state.message == "run 0123456789ab: aligned, 1 criteria pass"
    assert state.result()["run_id"] == "0123456789ab"


def test_a_failed_verdict_is_a_failed_state_named_not_aligned_with_the_reasons() -> None:
    reason = "|me(lm_loss)| < 0.001 failed: value +2.3e-03 (driven by steps 4, 5)"
    state = run_state(view(verdict="fail", criteria=(CRITERION,), reasons=(reason,)))
    assert (state.type.value, state.name) == ("FAILED", NOT_ALIGNED)
    assert state.message == f"run 0123456789ab: {reason}"
    with pytest.raises(NotAligned) as raised:
        state.result()
    assert raised.value.record["verdict"] == "fail"
    # without recorded reasons (older records), the failed criteria with their values
    assert run_state(view(verdict="fail", criteria=(CRITERION,))).message == (
        "run 0123456789ab: |me(lm_loss)| < 0.001: +2.3e-03")


def test_an_error_is_a_failed_state_whose_message_is_the_cause() -> None:
    state = run_state(view(status="failed", verdict="fail", error="gpu_train: load_return: missing keys"))
    assert (state.type.value, state.name) == ("FAILED", "Failed")
    assert state.message == "run 0123456789ab failed: gpu_train: load_return: missing keys"
    with pytest.raises(AlignflowError, match="load_return"):
        state.result()
    long = run_state(view(status="failed", error="x" * 5000)).message
    assert long is not None
    assert len(long) == 2000


def test_a_reused_step_ends_cached_naming_the_run_it_came_from() -> None:
    cached = StepOutcome("gpu_train", StepStatus.CACHED, step_run_id="5f5f5f5f5f5f", reused_from_run="aaaaaaaaaaaa",
                         reused_from_step="a0a0a0a0a0a0")
    state = step_state(cached)
    assert not isinstance(state, StepOutcome)
    assert (state.type.value, state.name) == ("COMPLETED", "Cached")
    # the step run it reuses, as the CLI names it: not 5f5f…, this run's own record of the reuse (issue 47)
    assert state.message == "reused from run aaaaaaaaaaaa (step run a0a0a0a0a0a0)"
    assert state.result() is cached
    ran = StepOutcome("gpu_train", StepStatus.RAN)
    assert step_state(ran) is ran


def test_flow_run_names_carry_the_experiment_the_run_id_and_what_kind_of_run() -> None:
    assert flow_run_name("demo", "0123456789ab", RunOptions()) == "align-demo-0123456789ab"
    assert flow_run_name("demo", "0123456789ab", RunOptions(parent="aaaa", force=("gpu_train",))) == (
        "align-demo-0123456789ab-rerun-gpu_train")
    assert flow_run_name("demo", "0123456789ab", RunOptions(parent="aaaa", reproduce_of="aaaa")) == (
        "align-demo-0123456789ab-reproduce")
    assert flow_run_name("demo", None, RunOptions()) == "align-demo"


def test_a_flow_run_is_named_by_the_experiments_name_from_its_first_log_line(tmp_path: Any,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 47: `_ux_ctrlc.yaml` (name: ux-ctrlc) was `align-_ux_ctrlc-...` in Prefect's logs until the flow renamed
    # itself, and `align-ux-ctrlc-...` in the CLI and the UI
    from prefect.runtime import flow_run

    from flows.alignment import _flow_run_name

    path = tmp_path / "_ux_ctrlc.yaml"
    path.write_text("name: ux-ctrlc\n")
    monkeypatch.setattr(flow_run, "parameters", {"experiment": str(path), "run_id": "0123456789ab"}, raising=False)
    assert _flow_run_name() == "align-ux-ctrlc-0123456789ab"
    monkeypatch.setattr(flow_run, "parameters", {"experiment": str(tmp_path / "gone.yaml")}, raising=False)
    assert _flow_run_name() == "align-gone"


def test_a_run_name_typed_in_the_form_is_kept(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 47: a name typed in the run form's Run Name was silently replaced by align-<experiment>-<run id>
    from prefect.runtime import flow_run

    from flows.alignment import _flow_run_name
    from flows.states import given_name

    assert given_name("night check of bf16") == "night check of bf16"
    assert given_name("GLM_try3") == "GLM_try3"
    for generated in ("crimson-falcon", "align-demo", "align-demo-0123456789ab", "", None):  # Prefect's or ours
        assert given_name(generated) is None
    path = tmp_path / "demo.yaml"
    path.write_text("name: demo\n")
    monkeypatch.setattr(flow_run, "parameters", {"experiment": str(path)}, raising=False)
    monkeypatch.setattr(flow_run, "name", "night check of bf16", raising=False)
    assert _flow_run_name() == "night check of bf16"
    monkeypatch.setattr(flow_run, "name", "crimson-falcon", raising=False)
    assert _flow_run_name() == "align-demo"
