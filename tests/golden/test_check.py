"""Golden values per side: the margins of Megatron's and MindSpeed-LLM's CI, the first step and metric out of them."""

from __future__ import annotations

import pytest

from alignflow.config.golden import DEFAULT_MARGINS, GoldenConfig, Margin
from alignflow.golden import check_side


def values(lm: list[float], *, time: list[float] | None = None, mem: float | None = None) -> dict:
    steps = range(1, len(lm) + 1)
    metrics = {"lm_loss": {str(s): v for s, v in zip(steps, lm, strict=True)}}
    if time is not None:
        metrics["step_time_ms"] = {str(s): v for s, v in zip(steps, time, strict=True)}
    memory = {"0": {"allocated_mb": mem / 2, "max_allocated_mb": mem}} if mem is not None else {}
    return {"metrics": metrics, "steps": list(steps), "memory": memory}


def check(golden: dict, actual: dict, margins: dict) -> object:
    return check_side(golden, actual, margins, experiment="e", side="gpu", run_id="r", version=1, golden_run="g")


def test_megatron_defaults_want_equal_losses_and_name_the_first_step_out() -> None:
    golden = values([5.0, 4.9, 4.8, 4.7, 4.6], time=[300, 100, 100, 100, 100, 100][:5], mem=80.0)
    same = check(golden, golden, DEFAULT_MARGINS["megatron"])
    assert same.status == "pass"
    assert same.checked == ("lm_loss", "step_time_ms", "mem_allocated_mb", "mem_max_allocated_mb")
    assert same.skipped == ("mtp_1_loss: in neither log", "num_zeros: in neither log")
    moved = check(golden, values([5.0, 4.9, 4.8001, 4.7002, 4.6], time=[300, 100, 100, 100, 100], mem=80.0),
                  DEFAULT_MARGINS["megatron"])
    assert moved.status == "fail"
    assert moved.first is not None
    assert (moved.first.metric, moved.first.step) == ("lm_loss", 3)
    assert moved.first.text() == "lm_loss at step 3: 4.8001 vs golden 4.8 (deterministic: must be equal)"
    assert len(moved.failures) == 2


def test_megatron_iteration_time_leaves_out_the_first_three_and_the_last_step() -> None:
    golden = values([5.0] * 6, time=[900, 900, 900, 100, 100, 100])
    actual = values([5.0] * 6, time=[100, 500, 100, 104, 100, 999])  # within 5 % where it counts
    assert check(golden, actual, {"step_time_ms": DEFAULT_MARGINS["megatron"]["step_time_ms"]}).status == "pass"
    slow = check(golden, values([5.0] * 6, time=[900, 900, 900, 106, 100, 100]),
                 {"step_time_ms": DEFAULT_MARGINS["megatron"]["step_time_ms"]})
    assert slow.first is not None
    assert (slow.first.metric, slow.first.step) == ("step_time_ms", 4)


def test_mindspeed_defaults_are_relative_one_sided_and_averaged() -> None:
    m = DEFAULT_MARGINS["mindspeed"]
    golden = values([5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 1.0], time=[500] * 5 + [100, 100], mem=100.0)
    within = values([5.09, 4.07, 3.05, 2.03, 1.01, 1.0, 1.0], time=[900] * 5 + [104, 104], mem=109.0)
    assert check(golden, within, m).status == "pass"
    faster_smaller = values([5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 1.0], time=[500] * 5 + [50, 50], mem=50.0)
    assert check(golden, faster_smaller, m).status == "pass"  # less time or memory never fails
    worse = check(golden, values([5.0, 4.1, 3.0, 2.0, 1.0, 1.0, 1.0], time=[500] * 5 + [106, 106], mem=111.0), m)
    texts = [f.text() for f in worse.failures]
    assert texts == ["lm_loss at step 2: 4.1 vs golden 4 (rtol 0.02)",
                     "step_time_ms at mean of steps 6-7: 106 vs golden 100 (rtol 0.05, only an increase counts)",
                     "mem_allocated_mb at rank 0: 55.5 vs golden 50 (rtol 0.1, only an increase counts)",
                     "mem_max_allocated_mb at rank 0: 111 vs golden 100 (rtol 0.1, only an increase counts)"]


def test_a_missing_step_or_metric_is_out_of_margin() -> None:
    golden = values([5.0, 4.9, 4.8])
    short = check(golden, values([5.0, 4.9]), {"lm_loss": Margin(rtol=0.1)})
    assert short.first is not None
    assert short.first.text() == "lm_loss at step 3: missing vs golden 4.8 (rtol 0.1)"
    new_metric = check(values([5.0]), {"metrics": {"lm_loss": {"1": 5.0}, "grad_norm": {"1": 1.0}}},
                       {"grad_norm": Margin(rtol=0.1)})
    assert new_metric.status == "fail"


def test_the_megatron_set_checks_what_megatrons_tests_check_by_default() -> None:
    assert list(GoldenConfig().resolved()) == ["lm_loss", "num_zeros"]  # test_regular_pipeline's METRICS default
    assert list(GoldenConfig(defaults="mindspeed").resolved()) == list(DEFAULT_MARGINS["mindspeed"])
    with_time = GoldenConfig.model_validate({"margins": {"step_time_ms": {"rtol": 0.5}}}).resolved()
    assert list(with_time) == ["lm_loss", "num_zeros", "step_time_ms"]


def test_golden_config_overrides_and_refuses_metrics_without_margins() -> None:
    config = GoldenConfig.model_validate({"defaults": "mindspeed", "margins": {"lm_loss": {"deterministic": True}},
                                         "metrics": ["lm_loss", "grad_norm"]})
    assert config.resolved() == {"lm_loss": Margin(deterministic=True), "grad_norm": DEFAULT_MARGINS["mindspeed"][
        "grad_norm"]}
    with pytest.raises(ValueError, match="no margin for 'iteration_time'"):
        GoldenConfig.model_validate({"metrics": ["iteration_time"]})
    with pytest.raises(ValueError, match="a margin needs"):
        Margin()


def test_another_default_set_leaves_out_the_metrics_it_has_no_margin_for() -> None:
    # issue 47: `alignflow golden check RUN --defaults mindspeed` on demo-matrix exited 2 on mtp_1_loss
    demo_matrix = GoldenConfig.model_validate(
        {"defaults": "megatron", "metrics": ["lm_loss", "mtp_1_loss", "mem_allocated_mb", "mem_max_allocated_mb"]})
    margins, skipped = demo_matrix.with_defaults("mindspeed")
    assert skipped == ["mtp_1_loss"]
    assert margins == {m: DEFAULT_MARGINS["mindspeed"][m] for m in ("lm_loss", "mem_allocated_mb",
                                                                    "mem_max_allocated_mb")}
    assert GoldenConfig().with_defaults("mindspeed") == (GoldenConfig(defaults="mindspeed").resolved(), [])
