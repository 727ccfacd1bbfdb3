"""Golden values of recorded runs in the runner's lab: record a run's sides, check runs against them, a changed
learning rate named at its first step, versions kept; `alignflow golden` exit codes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.config.golden import DEFAULT_MARGINS
from alignflow.runner.engine import StepRunner
from alignflow.runner.goldens import check_goldens, record_goldens
from alignflow.runner.session import open_run
from alignflow.transport import JobSpec
from tests.runner.conftest import FakeJob, FakeLab, twin_job
from tests.runner.test_matrix import VARIANTS, with_variants

LOG = "gpu_train"


def curve(lr: float, steps: int = 8) -> list[float]:
    """Step 1 is the same for any learning rate (nothing was updated yet); later steps move with it."""
    return [5.0 - 0.01 * s - (lr - 1e-3) * 100 * (s - 1) for s in range(1, steps + 1)]


def lr_job(spec: JobSpec) -> FakeJob:
    from alignflow.logs.render import megatron_line, mindformers_pynative_line

    argv = list(spec.argv)
    if any("torch_train" in a for a in argv):
        lr = float(argv[argv.index("--lr") + 1])
        lines = [" successfully loaded checkpoint from /x [ t 1/1, p 1/1 ] at iteration 0"]
        lines += [megatron_line(s, 8, consumed_samples=4 * s, elapsed_ms=10.0, lr=lr, global_batch_size=4,
                                losses={"lm loss": v}, grad_norm=1.0, microseconds=False)
                  for s, v in enumerate(curve(lr), 1)]
        lines.append("[Rank 0] (after 1 iterations) memory (MB) | allocated: 9.0 | max allocated: 12.0 | "
                     "reserved: 14.0 | max reserved: 14.0")
        return FakeJob(stdout="\n".join(lines) + "\n")
    if any("mindspore_train" in a for a in argv) and not spec.name.endswith("npu_base_train"):
        config = yaml.safe_load((Path(spec.cwd or "") / "config.yaml").read_text())
        lr = float(config["lr_scheduler"]["learning_rate"])
        lines = ["All Network parameters are loaded."]
        lines += [mindformers_pynative_line(s, 8, loss=v, step_time_ms=10, lr=lr, grad_norm=1.0,
                                            consumed_samples=4 * s, global_batch_size=4)
                  for s, v in enumerate(curve(lr), 1)]
        return FakeJob(stdout="\n".join(lines) + "\n")
    return twin_job(spec)


def runners(lab: FakeLab) -> Callable[[str], StepRunner]:
    return lambda rid: StepRunner(open_run(lab.store, rid), store=lab.store, state_dir=lab.state,
                                  transport_factory=lab.transport, controller=lab.controller)


def megatron(rid: str) -> dict:
    return dict(DEFAULT_MARGINS["megatron"])


def test_a_changed_learning_rate_fails_the_golden_check_at_its_first_step(lab: FakeLab) -> None:
    lab.script = lr_job
    first = lab.run()
    records = record_goldens(lab.store, first.run_id, runner_for=runners(lab), local_dir=lab.state / "g")
    assert [(r.experiment, r.side, r.version, r.run_id) for r in records] == [
        ("tiny", "npu", 1, first.run_id), ("tiny", "gpu", 1, first.run_id)]
    assert records[1].values["memory"]["0"]["max_allocated_mb"] == 12.0
    same = check_goldens(lab.store, first.run_id, runner_for=runners(lab), local_dir=lab.state / "g",
                         margins_for=megatron)
    assert same.verdict == "pass", same.reasons()
    lab.edit(training__lr=2.0e-3)
    perturbed = lab.run()
    check = check_goldens(lab.store, perturbed.run_id, runner_for=runners(lab), local_dir=lab.state / "g",
                          margins_for=megatron)
    assert check.verdict == "fail"
    by_side = {s.side: s for s in check.sides}
    for side in ("npu", "gpu"):
        first_out = by_side[side].first
        assert first_out is not None
        assert (first_out.metric, first_out.step) == ("lm_loss", 2)
    assert check.reasons()[1].startswith(f"tiny gpu: first out of margin: lm_loss at step 2: 4.88 vs golden 4.98 "
                                         f"(deterministic: must be equal); 6 more value(s) out of margin (golden v1 "
                                         f"from run {first.run_id})")
    # the perturbed run becomes version 2; the first stays
    record_goldens(lab.store, perturbed.run_id, runner_for=runners(lab), local_dir=lab.state / "g", sides=("gpu",))
    assert [(g.side, g.version) for g in lab.store.goldens("tiny")] == [("gpu", 2), ("gpu", 1), ("npu", 1)]


def test_a_matrix_records_and_checks_its_variants_as_experiments_of_their_own(lab: FakeLab) -> None:
    with_variants(lab, VARIANTS)
    view = lab.run()
    records = record_goldens(lab.store, view.run_id, runner_for=runners(lab), local_dir=lab.state / "g")
    names = {(r.experiment, r.side) for r in records}
    assert ("tiny/01_recompute", "gpu") in names
    assert ("tiny", "npu") in names
    assert ("tiny/04_capacity", "gpu") not in names  # an OOM has nothing to record
    check = check_goldens(lab.store, view.run_id, runner_for=runners(lab), local_dir=lab.state / "g",
                          margins_for=megatron)
    assert check.verdict == "pass", check.reasons()
    status = {(s.experiment, s.side): s.status for s in check.sides}
    assert status[("tiny/03_bf16", "npu")] == "pass"
    assert status[("tiny/04_capacity", "gpu")] == "no golden"  # its OOM had nothing to record
    note = next(s.note for s in check.sides if (s.experiment, s.side) == ("tiny/04_capacity", "gpu"))
    assert note.startswith("no golden values recorded, and none can be from run ")  # not "golden record RUN"
    assert "its training failed (" in note
    assert "out of memory" in note.lower()


def test_the_cli_exits_0_1_2(lab: FakeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    lab.script = lr_job
    first = lab.run()
    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(lab.state))
    monkeypatch.setattr("alignflow.cli.golden._runner_for", lambda store, state: runners(lab))
    cli = CliRunner()
    none = cli.invoke(app, ["golden", "check", first.run_id])
    assert none.exit_code == 2, none.output
    assert "no golden values recorded" in none.output
    recorded = cli.invoke(app, ["golden", "record", first.run_id, "--side", "gpu", "--note", "first"])
    assert recorded.exit_code == 0, recorded.output
    assert re.search(r"golden tiny gpu v1: 8 steps from run \w+ \(log \w{12}\)", recorded.output)
    ok = cli.invoke(app, ["golden", "check", first.run_id, "--side", "gpu", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["verdict"] == "pass"
    lab.edit(training__lr=2.0e-3)
    bad = cli.invoke(app, ["golden", "check", lab.run().run_id, "--side", "gpu"])
    assert bad.exit_code == 1, bad.output
    assert "first out of margin: lm_loss at step 2" in bad.output
    assert cli.invoke(app, ["golden", "check", first.run_id, "--side", "tpu"]).exit_code == 2
    listed = cli.invoke(app, ["golden", "list", "tiny"])
    assert "tiny gpu v1" in listed.output
    assert "— first" in listed.output
    typo = cli.invoke(app, ["golden", "list", "tiyn"])
    assert typo.exit_code == 2, typo.output
    assert "'tiyn': no golden values recorded (did you mean 'tiny'?)" in typo.output
    assert typo.exception is None or isinstance(typo.exception, SystemExit)
    # golden.metrics names mtp_1_loss, which MindSpeed's set has no margin for: --defaults mindspeed checks the
    # others and says so (issue 47: it exited 2, on the shipped demo-matrix)
    lab.edit(golden__metrics=["lm_loss", "mtp_1_loss"])
    other = cli.invoke(app, ["golden", "check", lab.run().run_id, "--side", "gpu", "--defaults", "mindspeed"])
    assert other.exit_code in (0, 1), other.output
    assert "note: tiny: the mindspeed set has no margin for mtp_1_loss (in its golden.metrics): not checked" in \
        other.output
    assert "lm_loss" in other.output


def test_the_nightlys_golden_check_runs_only_where_goldens_exist(lab: FakeLab) -> None:
    from alignflow.runner.goldens import check_run_goldens

    lab.script = lr_job
    first = lab.run()
    assert check_run_goldens(lab.store, first.run_id, state_dir=lab.state, transport_factory=lab.transport) is None
    record_goldens(lab.store, first.run_id, runner_for=runners(lab), local_dir=lab.state / "g")
    lab.edit(training__lr=2.0e-3)
    moved = lab.run()
    check = check_run_goldens(lab.store, moved.run_id, state_dir=lab.state, transport_factory=lab.transport)
    assert check is not None
    assert check.verdict == "fail"
    assert "lm_loss at step 2" in check.reasons()[0]
