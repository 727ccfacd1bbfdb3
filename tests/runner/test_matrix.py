"""A matrix run in the runner's lab: one child run per training, trainings a variant does not change taken from the
reference by their fingerprint (the reference trains once), OOM recognised, a layout the host cannot hold refused
before anything starts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from alignflow.runview import run_view
from alignflow.transport import JobSpec
from tests.runner.conftest import FakeJob, FakeLab, gpu_log, npu_log, twin_job

VARIANTS = {
    "reference": "00_base",
    "warmup_steps": 2,
    "criteria": [{"metric": "lm_loss", "statistic": "mean_rel", "threshold": "0.001%"}],
    "configs": {
        "01_recompute": {"switch": "Recompute off→on", "patch": {"training": {"recompute": "full"}}},
        "02_gpu_only": {"switch": "GPU env", "patch": {"gpu": {"env": {"NCCL_DEBUG": "INFO"}}}},
        "03_bf16": {"switch": "bf16 write-back", "expect": "fail", "patch": {"training": {"bf16": True}}},
        "04_capacity": {"switch": "capacity", "expect": "oom",
                        "patch": {"gpu": {"env": {"ALIGNFLOW_TWIN_DEVICE_MEMORY_MB": "1"}}}},
    },
}
OOM = ("Traceback (most recent call last):\n  File \"torch_train.py\", line 1, in <module>\n"
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 1.00 "
       "MiB of which 0.00 MiB is free.\n")


def matrix_job(spec: JobSpec) -> FakeJob:
    """The twin's jobs: bf16 write-back moves the loss, a device capacity runs out of memory."""
    argv = " ".join(spec.argv)
    if "torch_train" in argv:
        if spec.env.get("ALIGNFLOW_TWIN_DEVICE_MEMORY_MB"):
            return FakeJob(exit_code=1, stderr=OOM)
        steps = int(spec.argv[list(spec.argv).index("--train-iters") + 1])
        return FakeJob(stdout=gpu_log(steps, loss=5.01 if "--bf16" in argv else 5.0))
    if "mindspore_train" in argv and not spec.name.endswith("npu_base_train"):
        config = yaml.safe_load((Path(spec.cwd or "") / "config.yaml").read_text())
        bf16 = config["model"]["model_config"]["params_dtype"] == "bfloat16"
        return FakeJob(stdout=npu_log(config["training"]["steps"], loss=5.01 if bf16 else 5.0, loaded=True))
    return twin_job(spec)


def with_variants(lab: FakeLab, variants: dict) -> None:
    data = yaml.safe_load(lab.experiment.read_text())
    data["variants"] = variants
    lab.experiment.write_text(yaml.safe_dump(data, sort_keys=False))
    lab.script = matrix_job


def launched(lab: FakeLab, host: str, step: str) -> int:
    return sum(1 for name in lab.launched(host) if name == step)


def test_a_matrix_trains_the_reference_once_and_judges_each_variant(lab: FakeLab) -> None:
    with_variants(lab, VARIANTS)
    view = lab.run()
    assert (view.status, view.verdict) == ("completed", "pass"), (view.error, view.matrix)
    doc = view.model_dump(mode="json")
    assert [(v["name"], v["outcome"], v["as_expected"]) for v in doc["variants"]] == [
        ("01_recompute", "pass", True), ("02_gpu_only", "pass", True), ("03_bf16", "fail", True),
        ("04_capacity", "oom", True)]
    # the reference's trainings ran once, in the run itself; each variant trained what it changes, once
    assert launched(lab, "cuda", "gpu_train") == 1 + 4
    assert launched(lab, "ascend", "npu_reload_train") == 1 + 2  # 02 and 04 change the GPU side only
    assert launched(lab, "ascend", "npu_base_train") == 1
    # ... and the records say so: the GPU-only variant's NPU training is the reference's step run
    reference_npu = view.step("npu_reload_train")
    assert reference_npu is not None
    assert reference_npu.status == "ran"
    children = {c.experiment: c for c in lab.store.children(view.run_id)}
    assert set(children) == {f"tiny/{n}" for n in VARIANTS["configs"]}
    gpu_only = run_view(lab.store, children["tiny/02_gpu_only"].id)
    shared = gpu_only.step("npu_reload_train")
    assert shared is not None
    assert (shared.status, shared.reused_from) == ("cached", reference_npu.step_run_id)
    assert gpu_only.step("npu_base_train").status == "skipped"  # type: ignore[union-attr]
    oom = run_view(lab.store, children["tiny/04_capacity"].id)
    assert (oom.status, oom.verdict) == ("failed", "fail")
    assert children["tiny/03_bf16"].verdict == "fail"
    assert children["tiny/01_recompute"].verdict == "pass"
    record = lab.store.matrix(view.run_id)
    assert record is not None
    assert Path(str(record.report)).is_file()


def test_a_matrix_run_again_reuses_every_training(lab: FakeLab) -> None:
    with_variants(lab, VARIANTS)
    lab.run()
    before = {h: list(lab.launched(h)) for h in ("ascend", "cuda")}
    again = lab.run()
    assert again.verdict == "pass"
    after = {h: list(lab.launched(h)) for h in ("ascend", "cuda")}
    assert after["ascend"] == before["ascend"]
    # only the capacity probe's GPU training runs again: a failed step is never a cache entry
    assert after["cuda"] == [*before["cuda"], "gpu_train"]


def test_a_variant_the_host_cannot_hold_stops_the_matrix_before_any_training(lab: FakeLab) -> None:
    with_variants(lab, {"configs": {"01_dp2": {"patch": {"gpu": {"parallel": {"dp": 2}},
                                                         "training": {"micro_batch_size": 2}}}}})
    view = lab.run()
    assert view.status == "error"  # a configuration error: nothing about the alignment was learned (exit 2)
    assert view.exit_code == 2
    assert "the matrix cannot run (nothing of it was started)" in str(view.error)
    assert "needs 2 per node on host cuda, which has 1" in str(view.error)
    assert launched(lab, "cuda", "gpu_train") == 1  # the reference's own
    assert lab.store.children(view.run_id) == []


def test_an_unexpected_outcome_fails_the_matrix_and_names_the_variant(lab: FakeLab) -> None:
    configs = dict(VARIANTS["configs"])
    configs["03_bf16"] = {**configs["03_bf16"], "expect": "pass"}
    with_variants(lab, {**VARIANTS, "configs": configs})
    view = lab.run()
    assert (view.status, view.verdict) == ("completed", "fail")
    assert view.matrix is not None
    assert view.matrix["verdict"] == "fail"
    assert any(r.startswith("03_bf16: fail, expected pass") for r in view.matrix["reasons"])


def test_an_interrupted_matrix_kills_its_variants_jobs_and_records_every_run_cancelled(lab: FakeLab) -> None:
    from alignflow.runner.run import execute_pipeline
    from alignflow.testing import Command
    from alignflow.transport import Transport
    from tests.runner.hosts import DirHost, VirtualClock, dir_transport

    with_variants(lab, {"configs": {"01_recompute": {"patch": {"training": {"recompute": "full"}}}}})
    run_id = lab.start()
    handlers: dict[str, DirHost] = {}

    def variant_hangs(spec: JobSpec) -> FakeJob:
        job = matrix_job(spec)
        return job if spec.name.startswith(run_id) else FakeJob(stdout=job.stdout, running_polls=None)

    pressed: list[bool] = []

    class SlowedByCtrlC(VirtualClock):
        """Virtual time that moves no faster than a real 10 ms a sleep once Ctrl-C is pressed: the hung variant's
        job must end cancelled by the interrupt, not by its time limit, which its polling thread would otherwise
        spin through (a day of virtual time in about a second of polls) while a busy controller is still taking
        the signal and killing the jobs. A day of virtual time now takes minutes of polls."""

        def sleep(self, seconds: float) -> None:
            if pressed:
                time.sleep(0.01)
            super().sleep(seconds)

    clock = SlowedByCtrlC()

    def interrupted(command: Command) -> None:
        """Ctrl-C once a variant's job is running: SIGINT to this process, which Python delivers to the main thread
        (blocked on the variants' walks), as a terminal's Ctrl-C."""
        if command.name == "status" and not pressed and any(
                not s.name.startswith(run_id) for h in handlers.values() for s in h.launched):
            pressed.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    def factory(host: object) -> Transport:
        from alignflow.config.hosts import Host

        assert isinstance(host, Host)
        handler = handlers.get(host.name)
        if handler is None:
            handler = handlers[host.name] = DirHost(host, script=variant_hangs)
            handler.before = interrupted
        return dir_transport(host, handler, controller=lab.controller_transport, clock=clock)

    # Python's own SIGINT handler, installed again: a runtime that ran in this worker before (MindSpore's, after its
    # first op) replaces it at the C level without Python knowing (signal.getsignal still names Python's), and then
    # the Ctrl-C never becomes a KeyboardInterrupt
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            execute_pipeline(run_id, store=lab.store, state_dir=lab.state, transport_factory=factory,
                             controller=lab.controller)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert pressed
    assert handlers["cuda"].cancelled or handlers["ascend"].cancelled  # the variant's job was killed
    (child,) = lab.store.children(run_id)
    assert lab.store.get_run(child.id).status == "cancelled"
    assert lab.store.get_run(run_id).status == "cancelled"
    # killed at once, not left to run into its time limit
    trainings = [s for s in lab.store.steps(child.id) if s.step in ("gpu_train", "npu_reload_train")]
    assert trainings
    assert all(s.status == "cancelled" for s in trainings), [(s.step, s.status, s.error) for s in trainings]


def test_groups_train_their_own_reference_with_their_steps(lab: FakeLab) -> None:
    with_variants(lab, {"reference": "00_B", "groups": {"S8": {"steps": 8, "warmup_steps": 2},
                                                        "S12": {"steps": 12, "warmup_steps": 4}},
                        "configs": {"01_recompute": {"patch": {"training": {"recompute": "full"}}},
                                    "02_gpu": {"patch": {"gpu": {"env": {"NCCL_DEBUG": "INFO"}}}, "groups": ["S12"]}}})
    view = lab.run()
    assert view.verdict == "pass", view.matrix
    names = sorted(c.experiment for c in lab.store.children(view.run_id))
    assert names == ["tiny/S12/00_B", "tiny/S12/01_recompute", "tiny/S12/02_gpu", "tiny/S8/00_B",
                     "tiny/S8/01_recompute"]
    # the run's own trainings (8 steps) are S8's reference: that group's reference reuses them
    children = {c.experiment: c.id for c in lab.store.children(view.run_id)}
    s8_ref = run_view(lab.store, children["tiny/S8/00_B"]).step("gpu_train")
    assert s8_ref is not None
    assert s8_ref.status == "cached"
    s12_ref = run_view(lab.store, children["tiny/S12/00_B"]).step("gpu_train")
    assert s12_ref is not None
    assert s12_ref.status == "ran"
    record = lab.store.matrix(view.run_id)
    assert record is not None
    assert [(g["name"], g["warmup_steps"]) for g in record.summary["groups"]] == [("S8", 2), ("S12", 4)]
    rows = {(r["group"], r["variant"], r["side"]) for r in record.summary["rows"]}
    assert rows == {("S8", "01_recompute", "npu"), ("S8", "01_recompute", "gpu"), ("S12", "01_recompute", "npu"),
                    ("S12", "01_recompute", "gpu"), ("S12", "02_gpu", "gpu")}
