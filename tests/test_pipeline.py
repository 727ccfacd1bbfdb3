"""The pipeline's declarations and the planner: the steps derived from the checkpoint formats, `--from`, `--only`,
`--force`, optional steps, and the DAG's readiness rule that is the whole of the pipeline's concurrency."""

from __future__ import annotations

import pytest

from alignflow import pipeline
from alignflow.errors import PipelineError

MAIN = ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare")


PIPE = pipeline.DEFAULT


def _derive(base: str, *, trained: bool, npu: tuple[str, ...], gpu: tuple[str, ...]) -> pipeline.Pipeline:
    return pipeline.derive(pipeline.Formats(base, trained, {"npu": npu, "gpu": gpu}))  # type: ignore[arg-type]


def test_every_input_is_data_or_the_output_of_an_earlier_step() -> None:
    seen = {"data"}
    for spec in PIPE.steps:
        assert set(spec.inputs) <= seen, spec.name
        assert all(a in pipeline.STEP_NAMES for a in spec.after)
        seen |= set(spec.output_names)
    assert seen <= set(pipeline.ARTIFACTS)
    assert seen == {"data", "base_ckpt", "npu_base_log", "bf16_ckpt", "megatron_ckpt", "gate_report", "gpu_log",
                    "npu_log", "report", "diagnosis"}


def test_the_classic_pipeline_converts_the_bf16_export_to_megatron_for_the_gpu_side_only() -> None:
    assert PIPE.names == ("npu_base_train", "convert_bf16", "convert_megatron", "early_gate", "gpu_train",
                          "npu_reload_train", "compare", "diagnose")
    assert (PIPE.load("npu"), PIPE.load("gpu")) == ("bf16_ckpt", "megatron_ckpt")
    assert PIPE.step("convert_megatron").converts == ("mindformers", "megatron")


def test_two_megatron_sides_load_the_trained_base_with_no_conversion() -> None:
    pipe = _derive("megatron", trained=True, npu=("megatron",), gpu=("megatron",))
    assert pipe.names == ("npu_base_train", "early_gate", "gpu_train", "npu_reload_train", "compare", "diagnose")
    assert not [s for s in pipe.steps if s.converts]
    assert pipe.load("npu") == pipe.load("gpu") == "base_ckpt"
    assert pipe.step("early_gate").inputs == ("data", "base_ckpt")


def test_a_given_base_is_converted_once_per_format_a_side_needs() -> None:
    pipe = _derive("hf", trained=False, npu=("mindformers",), gpu=("megatron",))
    assert pipe.names == ("convert_mindformers", "convert_megatron", "early_gate", "gpu_train", "npu_reload_train",
                          "compare", "diagnose")
    assert pipe.step("convert_mindformers").inputs == pipe.step("convert_megatron").inputs == ("base_ckpt",)
    assert (pipe.load_format("npu"), pipe.load_format("gpu")) == ("mindformers", "megatron")
    assert pipe.producer("base_ckpt") is None  # a run input, like the data
    shared = _derive("hf", trained=False, npu=("megatron",), gpu=("megatron",))
    assert [s.name for s in shared.steps if s.converts] == ["convert_megatron"]
    assert shared.load("npu") == shared.load("gpu") == "megatron_ckpt"
    as_is = _derive("hf", trained=False, npu=("hf",), gpu=("megatron", "hf"))
    assert not [s for s in as_is.steps if s.converts]  # a side that loads the base's format takes it as it is


def test_a_step_of_another_pipeline_is_named_as_such() -> None:
    pipe = _derive("megatron", trained=True, npu=("megatron",), gpu=("megatron",))
    with pytest.raises(PipelineError, match="convert_megatron' is not part of this experiment's pipeline"):
        pipe.plan(only=["convert_megatron"])


def test_a_plain_plan_has_every_non_optional_step_and_forces_none() -> None:
    plan = PIPE.plan()
    assert plan.steps == MAIN
    assert plan.forced == frozenset()


def test_from_step_forces_it_and_every_later_step() -> None:
    plan = PIPE.plan(from_step="gpu_train")
    assert plan.steps == MAIN
    assert plan.forced == {"gpu_train", "npu_reload_train", "compare"}


def test_force_reaches_exactly_what_depends_on_the_forced_step() -> None:
    assert PIPE.plan(force=["convert_megatron"]).forced == {"convert_megatron", "gpu_train", "compare"}
    assert PIPE.plan(force=["npu_reload_train"]).forced == {"npu_reload_train", "compare"}
    gated = PIPE.plan(enabled_optional=["early_gate"], force=["convert_bf16"])
    assert gated.forced == {"convert_bf16", "convert_megatron", "early_gate", "gpu_train", "npu_reload_train",
                            "compare"}


def test_only_executes_exactly_those_steps() -> None:
    plan = PIPE.plan(only=["compare", "gpu_train"], force=["gpu_train"])
    assert [s for s in plan.steps if s not in plan.reuse_only] == ["gpu_train", "compare"]
    assert plan.forced == {"gpu_train", "compare"}


def test_an_optional_step_named_by_the_run_is_enabled_for_it() -> None:
    # `alignflow diagnose RUN` asks for only=diagnose; the launch form offers early_gate and diagnose as steps
    assert "early_gate" not in PIPE.plan().steps
    assert "diagnose" not in PIPE.plan().steps
    diagnose = PIPE.plan(only=["diagnose"], force=["diagnose"])
    assert [s for s in diagnose.steps if s not in diagnose.reuse_only] == ["diagnose"]
    assert diagnose.forced == {"diagnose"}
    assert diagnose.reuse_only == {"npu_base_train", "convert_bf16", "convert_megatron"}
    gate = PIPE.plan(from_step="early_gate")
    assert gate.steps == ("npu_base_train", "convert_bf16", "convert_megatron", "early_gate", "gpu_train",
                          "npu_reload_train", "compare")
    assert gate.forced == {"early_gate", "gpu_train", "npu_reload_train", "compare"}
    assert "diagnose" in PIPE.plan(force=["diagnose"]).steps


def test_an_unknown_step_is_named_with_the_closest_one() -> None:
    with pytest.raises(PipelineError, match="unknown step 'convert_megatorn'; did you mean 'convert_megatron'"):
        PIPE.plan(force=["convert_megatorn"])


def _waves(plan: pipeline.Plan) -> list[list[str]]:
    """The steps that can start together, wave by wave, if every started step ends before the next wave."""
    done: set[str] = set()
    waves = []
    while len(done) < len(plan.steps):
        wave = plan.ready(done=done, started=())
        assert wave, f"stuck after {sorted(done)}"
        waves.append(wave)
        done |= set(wave)
    return waves


def test_the_npu_reload_training_starts_beside_the_megatron_conversion() -> None:
    assert _waves(PIPE.plan()) == [["npu_base_train"], ["convert_bf16"], ["convert_megatron", "npu_reload_train"],
                                       ["gpu_train"], ["compare"]]


def test_with_the_gate_the_gpu_training_waits_for_it_and_the_npu_reload_training_does_not() -> None:
    assert _waves(PIPE.plan(enabled_optional=["early_gate"])) == [
        ["npu_base_train"], ["convert_bf16"], ["convert_megatron", "npu_reload_train"], ["early_gate"], ["gpu_train"],
        ["compare"]]
    plan = PIPE.plan(enabled_optional=["early_gate"])
    done = {"npu_base_train", "convert_bf16", "convert_megatron"}
    assert plan.ready(done=done, started={"npu_reload_train"}) == ["early_gate"]


def test_a_step_whose_producer_is_not_planned_does_not_wait_for_it() -> None:
    plan = pipeline.Plan(steps=("gpu_train", "compare"), forced=frozenset())
    assert plan.ready(done=(), started=()) == ["gpu_train"]
    assert plan.ready(done={"gpu_train"}, started=()) == ["compare"]


def test_started_and_done_steps_are_never_ready_again() -> None:
    plan = PIPE.plan()
    assert plan.ready(done=(), started={"npu_base_train"}) == []
    assert plan.ready(done={"npu_base_train"}, started=()) == ["convert_bf16"]


def test_only_walks_the_steps_it_reads_from_as_reuse_only() -> None:
    plan = PIPE.plan(only=["gpu_train"], force=["gpu_train"])
    assert plan.steps == ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train")
    assert plan.reuse_only == {"npu_base_train", "convert_bf16", "convert_megatron"}
    assert plan.forced == {"gpu_train"}  # a reuse-only step is never forced, even when forced downstream


def test_upstream_closure_is_every_step_a_step_needs() -> None:
    assert PIPE.upstream_closure(["compare"]) == ["npu_base_train", "convert_bf16", "convert_megatron",
                                                      "gpu_train", "npu_reload_train"]
    assert PIPE.upstream_closure(["convert_bf16"]) == ["npu_base_train"]
