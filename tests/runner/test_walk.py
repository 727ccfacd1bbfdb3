"""The DAG walker: every step starts as soon as the steps it reads from are done, through any scheduler."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from alignflow import pipeline
from alignflow.errors import PipelineError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.session import StepOutcome
from alignflow.runner.walk import walk
from alignflow.store.records import StepStatus


class Pending:
    def __init__(self, step: str, error: Exception | None) -> None:
        self.step, self.error = step, error

    def result(self) -> StepOutcome:
        if self.error is not None:
            raise self.error
        art = ArtifactRef(f"{self.step}-out", "h", f"/{self.step}", "0" * 64, 1, "log")
        outputs = {o: art for o in pipeline.DEFAULT.step(self.step).output_names}
        return StepOutcome(self.step, StepStatus.RAN, outputs)


class Recorder:
    """Submits instantly, finishes steps in submission order, and writes down what was in flight when."""

    def __init__(self, failing: Iterable[str] = ()) -> None:
        self.failing = set(failing)
        self.events: list[tuple[str, str, frozenset[str]]] = []
        self.in_flight: set[str] = set()

    def submit(self, step: str, available: Mapping[str, ArtifactRef]) -> Pending:
        # never submitted before its inputs exist
        assert set(pipeline.DEFAULT.step(step).inputs) <= set(available), step
        self.in_flight.add(step)
        self.events.append(("start", step, frozenset(self.in_flight)))
        return Pending(step, PipelineError(f"{step} broke") if step in self.failing else None)

    def first_done(self, futures: Iterable[Pending]) -> Pending:
        first = next(iter(futures))
        self.in_flight.discard(first.step)
        self.events.append(("end", first.step, frozenset(self.in_flight)))
        return first


DATA = {"data": ArtifactRef("data", "controller", "/d", "1" * 64, 1, "data")}


def test_the_npu_reload_training_is_in_flight_with_the_megatron_conversion() -> None:
    sched = Recorder()
    result = walk(pipeline.DEFAULT.plan(), DATA, sched)
    assert not result.failures
    assert set(result.outcomes) == set(pipeline.DEFAULT.plan().steps)
    started_with = {step: flight for kind, step, flight in sched.events if kind == "start"}
    assert {"convert_megatron", "npu_reload_train"} <= started_with["npu_reload_train"]
    assert started_with["compare"] == {"compare"}  # compare waits for both trainings


def test_a_failure_starts_nothing_new_but_lets_running_steps_finish() -> None:
    sched = Recorder(failing=["convert_megatron"])
    result = walk(pipeline.DEFAULT.plan(), DATA, sched)
    assert [f.step for f in result.failures] == ["convert_megatron"]
    assert result.error == "convert_megatron broke"
    assert "npu_reload_train" in result.outcomes  # in flight when the conversion failed: it finished
    started = [step for kind, step, _ in sched.events if kind == "start"]
    assert "gpu_train" not in started
    assert "compare" not in started


def test_every_failure_is_reported() -> None:
    sched = Recorder(failing=["convert_megatron", "npu_reload_train"])
    result = walk(pipeline.DEFAULT.plan(), DATA, sched)
    assert {f.step for f in result.failures} == {"convert_megatron", "npu_reload_train"}
    assert result.error is not None
    assert "convert_megatron: convert_megatron broke" in result.error
