"""Regression rules: verdict turned to fail, criterion values past their drift, runs that never finished.

Pure tests over criterion dicts shaped as the comparison records them (`CriterionResult.to_json`), plus the
store-backed lookup of the last passing run on a real SQLite store.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from alignflow.regression import (
    DriftLimit,
    DriftPolicy,
    RunOutcome,
    check_against_last_pass,
    check_run,
    criterion_key,
    not_started,
)
from alignflow.store import Store
from tests.store.sample import run_params


def crit(metric: str, statistic: str, value: float | None, threshold: float, *, passed: bool | None = None,
         absolute: bool = True, steps: list[int] | None = None, exclude: list[int] | None = None) -> dict[str, Any]:
    q = None if value is None else (abs(value) if absolute else value)
    return {"metric": metric, "statistic": statistic, "value": value, "threshold": threshold,
            "passed": (q is not None and q < threshold) if passed is None else passed,
            "label": f"|{statistic}({metric})| < {threshold:g}", "absolute": absolute, "steps": steps,
            "exclude_steps": exclude or []}


def outcome(run_id: str, criteria: list[dict[str, Any]], *, verdict: str | None = "pass", status: str = "completed",
            config: str = "c1") -> RunOutcome:
    return RunOutcome(run_id=run_id, experiment="exp", status=status, verdict=verdict, criteria=tuple(criteria),
                      config_sha256=config)


BASE = outcome("base", [crit("lm_loss", "me", 1e-4, 1e-3), crit("grad_norm", "me", -2e-3, 1e-2)])


def test_identical_run_is_no_regression() -> None:
    check = check_run(outcome("new", list(BASE.criteria)), BASE, DriftPolicy())
    assert not check.regressed
    assert [c.change for c in check.changes] == [0.0, 0.0]
    assert check.baseline_run_id == "base"


def test_verdict_turning_to_fail_is_a_regression_that_names_the_failing_criterion() -> None:
    now = outcome("new", [crit("lm_loss", "me", 5e-3, 1e-3), crit("grad_norm", "me", -2e-3, 1e-2)], verdict="fail")
    check = check_run(now, BASE, DriftPolicy())
    assert check.regressed
    assert check.reasons[0] == "verdict fail (last passing run base)"
    lm = next(c for c in check.changes if c.key == "me(lm_loss)")
    assert lm.passed_before is True
    assert lm.passed_now is False
    assert lm.regression is not None
    assert any(r.startswith("|me(lm_loss)| < 0.001: grew by") for r in check.reasons)


def test_value_past_its_drift_regresses_even_while_the_verdict_still_passes() -> None:
    # 1e-4 -> 4e-4: +300 %, more than both the relative (50 %) and the threshold share (10 % of 1e-3)
    now = outcome("new", [crit("lm_loss", "me", 4e-4, 1e-3), crit("grad_norm", "me", -2e-3, 1e-2)])
    check = check_run(now, BASE, DriftPolicy())
    assert check.verdict == "pass"
    assert check.reasons == ("|me(lm_loss)| < 0.001: grew by 0.0003 (allowed 0.0001)",)


def test_growth_within_the_drift_and_any_improvement_are_not_regressions() -> None:
    now = outcome("new", [crit("lm_loss", "me", 1.4e-4, 1e-3), crit("grad_norm", "me", 0.0, 1e-2)])
    check = check_run(now, BASE, DriftPolicy())
    assert not check.regressed
    lm, gn = check.changes
    assert lm.allowed == pytest.approx(1e-4)  # max(0.5 * 1e-4, 0.1 * 1e-3)
    assert gn.change == pytest.approx(-2e-3)  # |value| shrank: better


def test_the_threshold_share_keeps_values_near_zero_from_flagging_noise() -> None:
    base = outcome("base", [crit("lm_loss", "me", 0.0, 1e-3)])
    check = check_run(outcome("new", [crit("lm_loss", "me", 5e-5, 1e-3)]), base, DriftPolicy())
    assert not check.regressed  # relative growth is infinite, but 5e-5 is under 10 % of the threshold


def test_overrides_by_statistic_and_metric_or_by_metric() -> None:
    now = outcome("new", [crit("lm_loss", "me", 1.4e-4, 1e-3), crit("grad_norm", "me", -2.5e-3, 1e-2)])
    strict = DriftPolicy(overrides={"me(lm_loss)": DriftLimit(relative=0.1, of_threshold=0.01)},
                         default=DriftLimit(relative=0.1, of_threshold=0.01))
    assert [c.key for c in check_run(now, BASE, strict).changes if c.regression] == ["me(lm_loss)", "me(grad_norm)"]
    lenient = DriftPolicy(default=DriftLimit(relative=0.1, of_threshold=0.01),
                          overrides={"lm_loss": DriftLimit(relative=1.0), "me(grad_norm)": DriftLimit(relative=1.0)})
    assert not check_run(now, BASE, lenient).regressed


def test_signed_criteria_compare_the_signed_value() -> None:
    base = outcome("base", [crit("lm_loss", "mean_rel", -5e-3, 1e-2, absolute=False)])
    worse = check_run(outcome("new", [crit("lm_loss", "mean_rel", 5e-3, 1e-2, absolute=False)]), base,
                      DriftPolicy())
    assert worse.regressed  # -0.005 -> +0.005 grows by 0.01 > max(0.0025, 0.001)


def test_a_value_no_longer_computed_is_a_regression() -> None:
    now = outcome("new", [crit("lm_loss", "me", None, 1e-3, passed=False), crit("grad_norm", "me", -2e-3, 1e-2)],
                  verdict="fail")
    check = check_run(now, BASE, DriftPolicy())
    assert "|me(lm_loss)| < 0.001: value no longer computed" in check.reasons


def test_run_that_did_not_finish_is_a_regression_with_its_error() -> None:
    failed = RunOutcome(run_id="new", experiment="exp", status="failed", verdict="fail",
                        error="gpu_train: job exited 1")
    check = check_run(failed, BASE, DriftPolicy())
    assert check.reasons[0] == "run failed: gpu_train: job exited 1"


def test_failing_run_without_any_passing_baseline_is_reported_not_hidden() -> None:
    check = check_run(outcome("new", [crit("lm_loss", "me", 5e-3, 1e-3)], verdict="fail"), None, DriftPolicy())
    assert check.reasons == ("verdict fail (no passing baseline)",)
    assert check.baseline_run_id is None
    assert check.changes[0].baseline is None
    passing = check_run(outcome("new", list(BASE.criteria)), None, DriftPolicy())
    assert not passing.regressed


def test_criteria_pair_by_what_they_measure_not_by_threshold() -> None:
    assert criterion_key(crit("lm_loss", "step_rel", 1e-3, 5e-3, steps=[1])) == "step_rel(lm_loss)@steps=1"
    assert criterion_key(crit("lm_loss", "mean_rel", 1e-3, 1e-2, exclude=[2])) == "mean_rel(lm_loss)@excluding=2"
    base = outcome("base", [crit("lm_loss", "me", 1e-4, 1e-3)], config="c1")
    check = check_run(outcome("new", [crit("lm_loss", "me", 1e-4, 2e-3)], config="c2"), base, DriftPolicy())
    assert check.changes[0].baseline == pytest.approx(1e-4)
    assert check.config_changed


def test_not_started_is_a_regression() -> None:
    check = not_started("exp", "experiments/exp.yaml:3: model: field required")
    assert check.regressed
    assert check.reasons == ("not started: experiments/exp.yaml:3: model: field required",)


def record_run(store: Store, verdict: str, lm_me: float) -> str:
    store.ensure_experiment("exp", config={"a": 1}, config_sha256="c" * 64)
    run = store.create_run("exp", trigger="nightly", code_version="test", params=run_params("exp"))
    store.add_metrics(run.id, source="gpu", frame=pd.DataFrame({"lm_loss": [1.0]}, index=[1]))
    store.add_comparison(run.id, verdict=verdict, criteria=[crit("lm_loss", "me", lm_me, 1e-3)], summary={})
    store.finish_run(run.id, status="completed", verdict=verdict)
    return str(run.id)


def test_store_lookup_compares_with_the_newest_earlier_passing_run(tmp_path: Path) -> None:
    ticks = iter(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=m) for m in range(1000))
    with Store.open(state_dir=tmp_path, clock=lambda: next(ticks)) as store:
        old_pass = record_run(store, "pass", 1e-4)
        newer_pass = record_run(store, "pass", 2e-4)
        failing = record_run(store, "fail", 3e-3)
        check = check_against_last_pass(store, failing, DriftPolicy())
        assert check.baseline_run_id == newer_pass
        assert check.changes[0].baseline == pytest.approx(2e-4)
        assert check.regressed
        first = check_against_last_pass(store, old_pass, DriftPolicy())
        assert first.baseline_run_id is None  # never compared with itself or with later runs
        assert not first.regressed
