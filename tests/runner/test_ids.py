"""One id per thing (issue 40): every id a user is shown is labelled with what it is and accepted where it is typed.

The runs are real recordings of the runner (fake hosts, the real store and fetched logs on disk); the commands are
typed through the console script's entry point (`alignflow.cli.main`, which prints the error and picks the exit
code) against the lab's state dir.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from alignflow.cli import main
from alignflow.runner.session import StepOutcome
from alignflow.store.records import StepStatus
from tests.runner.conftest import FakeLab


@pytest.fixture
def alignflow(lab: FakeLab, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(lab.state))
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args: str) -> tuple[int, str]:
        monkeypatch.setattr("sys.argv", ["alignflow", *args])
        with pytest.raises(SystemExit) as ended:
            main()
        out = capsys.readouterr()
        return int(ended.value.code or 0), out.out + out.err

    return run


def test_a_step_run_id_shown_as_reused_from_is_accepted_by_show_and_logs_keep_one_name(  # type: ignore[no-untyped-def]
        lab: FakeLab, alignflow) -> None:
    parent = lab.run()
    rerun = lab.run(parent=parent.run_id, reuse_parent=True, force=("compare",))
    code, shown = alignflow("show", rerun.run_id)
    assert code == 0
    bf16 = next(s for s in lab.store.steps(parent.run_id) if s.step == "convert_bf16")
    assert f"[reused: step run {bf16.id} of run {parent.run_id}]" in shown
    code, step_run = alignflow("show", bf16.id)  # what a user copies from that line
    assert code == 0, step_run
    assert step_run.startswith(f"step run {bf16.id} is step convert_bf16 (ran) of run {parent.run_id}:")
    assert f"run {parent.run_id} of tiny: completed" in step_run
    # fetched logs keep one name, their step's, whether the step ran in the run or was reused (the rerun's compare
    # fetched its reused NPU log as `npu_log.log`)
    assert sorted(p.name for p in (lab.state / "runs" / rerun.run_id / "logs").iterdir()) == [
        "gpu_train.log", "npu_reload_train.log"]
    assert sorted(p.name for p in (lab.state / "runs" / parent.run_id / "logs").iterdir()) == [
        "gpu_train.log", "npu_base_train.log", "npu_reload_train.log"]
    code, missing = alignflow("show", "fedcba987654")
    assert code == 2
    assert "run 'fedcba987654': no such id, nor a step run's" in missing


def test_compare_takes_run_ids_and_a_run_id_with_a_step(lab: FakeLab, alignflow) -> None:  # type: ignore[no-untyped-def]
    first, second = lab.run(), lab.run(force=("gpu_train",))
    code, own = alignflow("compare", first.run_id)  # one run: its own GPU (reference) and NPU logs
    assert code == 0, own
    assert f"verdict: PASS  ({first.run_id}:npu_reload_train vs {first.run_id}:gpu_train" in own
    code, runs = alignflow("compare", f"{first.run_id}:gpu_train", f"{second.run_id[:6]}:gpu_train")
    assert code == 0, runs
    assert f"({second.run_id}:gpu_train vs {first.run_id}:gpu_train" in runs
    code, two = alignflow("compare", first.run_id, second.run_id)  # a run alone: its NPU training's log
    assert code == 0, two
    assert f"({second.run_id}:npu_reload_train vs {first.run_id}:npu_reload_train" in two
    code, bad = alignflow("compare", f"{first.run_id}:compare", second.run_id)
    assert code == 2
    assert "compare writes no training log" in bad


def test_the_progress_line_of_a_finished_step_labels_its_step_run_id() -> None:
    from tasks.progress import TaskReporter, observing

    ended: list[tuple[str, str, str]] = []

    class Observer:
        def message(self, text: str) -> None: ...

        def progress(self, progress: object) -> None: ...

        def step_ended(self, step: str, status: str, detail: str) -> None:
            ended.append((step, status, detail))

    with observing(Observer()):  # type: ignore[arg-type]
        TaskReporter(logging.getLogger("test"), "gpu_train").ended(
            StepOutcome("gpu_train", StepStatus.RAN, step_run_id="0123456789ab"))
    assert ended == [("gpu_train", "ran", "step run 0123456789ab")]


def _copy_keeping_the_name(lab: FakeLab, **changes: object) -> FakeLab:
    """A copy of the lab's experiment file elsewhere, edited, that keeps `name: tiny` (as a user copies one)."""
    import shutil

    import yaml

    copy = lab.root / "copy" / "tiny-lr.yaml"
    copy.parent.mkdir()
    shutil.copy(lab.root / "twin-moe.yaml", copy.parent / "twin-moe.yaml")
    doc = yaml.safe_load(lab.experiment.read_text())
    doc["training"].update(changes)
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dataclasses.replace(lab, experiment=copy)  # the same hosts, store and fakes


def test_a_run_records_the_configuration_it_ran_and_history_flags_a_copy_that_kept_the_name(
        lab: FakeLab, alignflow) -> None:  # type: ignore[no-untyped-def]
    first = lab.run()
    copied = _copy_keeping_the_name(lab, lr=3.0e-3).run()
    again = lab.run()
    runs = {r.id: r for r in lab.store.list_runs()}
    # each run under its own configuration (not the experiment's newest, which the copy recorded)
    assert runs[again.run_id].config_sha256 == runs[first.run_id].config_sha256
    assert runs[copied.run_id].config_sha256 != runs[first.run_id].config_sha256
    code, history = alignflow("history")
    assert code == 0
    original, copy = runs[first.run_id].config_sha256[:8], runs[copied.run_id].config_sha256[:8]
    assert (f"note: tiny ran under 2 configurations here: {original} from {lab.experiment} (2 run(s)); {copy} from "
            f"{lab.root / 'copy' / 'tiny-lr.yaml'} (1 run(s))") in " ".join(history.split())
    code, shown = alignflow("show", copied.run_id)
    assert f"config {copy} ({lab.root / 'copy' / 'tiny-lr.yaml'})" in " ".join(shown.split())


def test_the_nightly_baseline_is_a_passing_run_of_the_same_configuration_else_flagged(lab: FakeLab) -> None:
    from alignflow.regression import DriftPolicy, check_against_last_pass
    from flows.summaries import nightly_message

    copy = _copy_keeping_the_name(lab, lr=3.0e-3)
    copied = copy.run()  # only the copy has passed so far
    first = lab.run(trigger="nightly")
    check = check_against_last_pass(lab.store, first.run_id, DriftPolicy())
    assert check.baseline_run_id == copied.run_id
    assert check.config_changed
    (note,) = check.notes
    assert note.startswith(f"baseline run {copied.run_id} ran another configuration of tiny: config ")
    assert str(copy.experiment) in note
    assert str(lab.experiment) in note
    assert f"note: tiny: {note}" in nightly_message([check])
    second = lab.run(trigger="nightly")  # now a passing run of its own configuration exists: that one
    check = check_against_last_pass(lab.store, second.run_id, DriftPolicy())
    assert (check.baseline_run_id, check.config_changed, check.notes) == (first.run_id, False, ())


def test_a_run_stopped_by_its_configuration_is_an_error_for_the_nightly_not_a_verdict(lab: FakeLab) -> None:
    from alignflow.regression import DriftPolicy, check_against_last_pass

    lab.run()
    lab.edit(data__sha256="0" * 64)  # the data file is not the one declared
    stopped = lab.run(trigger="nightly")
    assert (stopped.status, stopped.verdict, stopped.exit_code) == ("error", None, 2)
    check = check_against_last_pass(lab.store, stopped.run_id, DriftPolicy())
    assert check.reasons[0].startswith("run error (configuration or environment; no alignment result): ")
    assert "differs from the declared data.sha256" in check.reasons[0]
