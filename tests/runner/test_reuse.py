"""What a run takes from earlier runs: its parent's steps (a re-run), the cache, staged inputs on hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.transport import JobSpec
from tests.runner.conftest import FakeLab, twin_job
from tests.runner.hosts import FakeJob
from tests.runner.test_execute import statuses


def test_a_rerun_takes_unchanged_steps_from_its_parent_and_executes_the_forced_one(lab: FakeLab) -> None:
    parent = lab.run()
    rerun = lab.run(parent=parent.run_id, reuse_parent=True, force=("compare",))
    assert statuses(rerun) == {**dict.fromkeys(("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train",
                                                "npu_reload_train"), "cached"), "compare": "ran"}
    parent_ids = {s.step: s.id for s in lab.store.steps(parent.run_id)}
    for s in lab.store.steps(rerun.run_id):
        if s.status == "cached":
            assert s.reused_from == parent_ids[s.step]


def test_a_rerun_after_an_edited_experiment_reexecutes_what_the_edit_reaches(lab: FakeLab) -> None:
    # issue 16, item 3: the parent trained at lr 1e-3; a rerun of `compare` with lr 3e-3 in the file must not
    # record lr 3e-3 beside trainings that never ran with it
    parent = lab.run()
    lab.edit(training__lr=3.0e-3)
    rerun = lab.run(parent=parent.run_id, reuse_parent=True, force=("compare",))
    got = statuses(rerun)
    assert got["gpu_train"] == got["npu_reload_train"] == got["npu_base_train"] == "ran"
    assert any("not taken from parent run" in m for m in lab.messages)
    recorded = lab.store.get_run(rerun.run_id).alignment_params().experiment.training.lr
    assert recorded == 3.0e-3  # and what was recorded is what trained


def test_a_corrupted_staged_input_is_replaced_by_a_verified_copy(lab: FakeLab) -> None:
    # issue 16, item 5: a flipped byte in a staged checkpoint directory must not wedge every later run
    first = lab.run()
    cuda = lab.fakes["cuda"]
    staged = sorted(p for p in Path(cuda.path("inputs")).rglob("*") if p.is_file() and "megatron_ckpt" in str(p))
    assert staged
    staged[0].write_bytes(b"flipped")
    second = lab.run(force=("gpu_train",))
    assert second.status == "completed", second.error
    assert any("staged megatron_ckpt changed" in m for m in lab.messages)
    assert first.verdict == second.verdict == "pass"


def test_two_steps_needing_one_input_on_one_host_stage_it_once(lab: FakeLab) -> None:
    lab.run()
    ascend = lab.fakes["ascend"]
    staged_data = {p.name for p in Path(ascend.path("inputs")).iterdir() if p.name.startswith("data-")}
    assert len(staged_data) == 1


def test_a_changed_data_file_reexecutes_every_training(lab: FakeLab) -> None:
    lab.run()
    lab.edit(data__generate__seed=8, data__path="data/other")
    again = lab.run()
    assert statuses(again)["npu_base_train"] == "ran"
    assert statuses(again)["gpu_train"] == "ran"


def test_a_failed_step_is_never_reused(lab: FakeLab) -> None:
    def broken(spec: JobSpec) -> FakeJob:
        return FakeJob(exit_code=3) if "convert bf16" in " ".join(spec.argv) else twin_job(spec)

    lab.script = broken
    lab.run()
    lab.script = twin_job
    again = lab.run()
    assert statuses(again)["convert_bf16"] == "ran"
    assert statuses(again)["npu_base_train"] == "cached"


def test_only_one_step_reuses_what_it_reads_and_executes_just_that_step(lab: FakeLab) -> None:
    lab.run()
    launched = {h: len(f.launched) for h, f in lab.hosts_of.items()}
    only = lab.run(only=("gpu_train",), force=("gpu_train",))
    assert only.status == "completed", only.error
    assert statuses(only) == {"npu_base_train": "cached", "convert_bf16": "cached", "convert_megatron": "cached",
                              "gpu_train": "ran", "npu_reload_train": "skipped", "compare": "skipped"}
    assert len(lab.hosts_of["cuda"].launched) == launched["cuda"] + 1
    assert len(lab.hosts_of["ascend"].launched) == launched["ascend"]


def test_only_a_step_whose_inputs_were_never_produced_fails_before_launching(lab: FakeLab) -> None:
    only = lab.run(only=("convert_megatron",))
    assert (only.status, only.verdict) == ("error", None)  # a request the store cannot serve, not a failed step
    assert "npu_base_train: no valid earlier result to reuse" in (only.error or "")
    assert not lab.hosts_of.get("cpu") or not lab.hosts_of["cpu"].launched


def test_a_run_of_its_parents_recorded_experiment_reads_the_parents_outputs_after_the_code_changed(
        lab: FakeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 40: `alignflow diagnose RUN` (a run of RUN's recorded experiment, executing only `diagnose`) refused
    # every run made before alignflow's code changed: its upstream steps' keys changed, so nothing was reusable
    parent = lab.run()
    for module in ("alignflow.backends.commands", "alignflow.backends.twin"):
        monkeypatch.setattr(f"{module}.code_version_for", lambda paths: "alignflow, edited since")
    pinned = lab.run(parent=parent.run_id, reuse_parent=True, recorded_from=parent.run_id, only=("compare",),
                     force=("compare",))
    assert pinned.status == "completed", pinned.error
    parent_ids = {s.step: s.id for s in lab.store.steps(parent.run_id)}
    assert {s.step: s.reused_from for s in lab.store.steps(pinned.run_id) if s.status == "cached"} == {
        step: parent_ids[step] for step in ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train",
                                            "npu_reload_train")}
    # a run of the file as it is now asks for today's outputs: the parent's, made by other code, are not those
    today = lab.run(parent=parent.run_id, reuse_parent=True, only=("compare",), force=("compare",))
    assert (today.status, today.verdict) == ("error", None)
    assert "no valid earlier result to reuse" in (today.error or "")
