"""The matrix comparison and its report: seed 004's rows, directions, shared sides, verdicts against expectations."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from alignflow.compare.context import TimingConditions
from alignflow.config.criteria import Criterion
from alignflow.config.variants import Matrix
from alignflow.logs.parse import parse_log
from alignflow.matrix.compare import ConfigTrainings, SideTraining, compare_matrix, short_name
from alignflow.matrix.memory import parse_memory
from alignflow.matrix.report import artifact_rows, html_page, markdown, tables, write_matrix_report
from alignflow.matrix.status import TrainingStatus, classify
from tests.matrix.synthetic import losses, megatron_log, mindformers_log

STEPS = 12
CRITERIA = [Criterion(metric="lm_loss", statistic="mean_rel", threshold="0.001%")]


def side(lines: list[str], *, identity: str, status: TrainingStatus | None = None) -> SideTraining:
    return SideTraining(status=status or TrainingStatus("completed", 0), parsed=parse_log(lines),
                        memory=parse_memory(lines), identity=identity)


def matrix(**configs: dict) -> Matrix:
    return Matrix.model_validate({"reference": "00_base", "warmup_steps": 2, "configs": configs})


@pytest.fixture
def trainings() -> dict[str, dict[str, ConfigTrainings]]:
    base_g, base_n = megatron_log(losses(STEPS), memory_mb=[700, 690]), mindformers_log(losses(STEPS), memory_mb=700)
    return {"default": {
        "00_base": ConfigTrainings("00_base", {"npu": side(base_n, identity="n0"), "gpu": side(base_g, identity="g0")}),
        # recompute: same numbers, slower, less memory on both sides
        "01_recompute": ConfigTrainings("01_recompute", {
            "npu": side(mindformers_log(losses(STEPS), ms=150, memory_mb=500), identity="n1"),
            "gpu": side(megatron_log(losses(STEPS), ms=150, memory_mb=[500, 490]), identity="g1")}),
        # a GPU-only switch: the NPU training is the reference's own (the same log)
        "02_gpu_only": ConfigTrainings("02_gpu_only", {
            "npu": side(base_n, identity="n0", status=TrainingStatus("completed", 0, reused=True)),
            "gpu": side(megatron_log(losses(STEPS), ms=80, memory_mb=[700, 690]), identity="g2")}),
        # EP1 (the OFF side): the reference is ON
        "03_ep1": ConfigTrainings("03_ep1", {
            "npu": side(base_n, identity="n0"),
            "gpu": side(megatron_log(losses(STEPS), ms=200, memory_mb=[700, 690]), identity="g3")}),
        # bf16 write-back: numerics change
        "05_bf16": ConfigTrainings("05_bf16", {
            "npu": side(mindformers_log(losses(STEPS, scale=1e-3)), identity="n5"),
            "gpu": side(megatron_log(losses(STEPS, scale=1e-3)), identity="g5")}),
        # a capacity probe: the GPU side ran out of memory before step 1
        "06_oom": ConfigTrainings("06_oom", {
            "npu": side(base_n, identity="n0"),
            "gpu": SideTraining(status=classify(step_status="failed", exit_code=1, error="exited(1)", texts=[
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity "
                "of 79.10 GiB of which 1.06 MiB is free. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
                "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"]))}),
    }}


def demo_matrix(**overrides: dict) -> Matrix:
    configs = {"01_recompute": {"patch": {}, "switch": "Recompute off→on"},
               "02_gpu_only": {"patch": {}, "switch": "Fusion off→on"},
               "03_ep1": {"patch": {}, "switch": "EP1→8", "direction": "on_off"},
               "05_bf16": {"patch": {}, "switch": "bf16 write-back off→on", "expect": "fail"},
               "06_oom": {"patch": {}, "switch": "capacity", "expect": "oom"}}
    return matrix(**{**configs, **overrides})


def test_rows_read_like_seed_004(trainings: dict) -> None:
    result = compare_matrix(demo_matrix(), trainings, criteria=CRITERIA, experiment="m")
    assert result.verdict == "pass", result.reasons
    by = {(r.variant, r.side): r for r in result.rows}
    recompute = by[("01_recompute", "gpu")]
    assert (recompute.configs, recompute.verdict, recompute.loss_mean_rel) == ("00→01", "pass", 0.0)
    assert recompute.perf_off
    assert recompute.perf_on
    # the performance window leaves the 2 warm-up steps (1.5x slower) out: exactly 100 and 150 ms
    assert (recompute.perf_off.ms_per_iter, recompute.perf_on.ms_per_iter) == (100.0, 150.0)
    assert recompute.throughput_change == pytest.approx(100 / 150 - 1)
    assert recompute.mem_max_saving == pytest.approx((700 - 500) / 700)
    assert recompute.mem_avg_saving == pytest.approx((695 - 495) / 695)
    # on_off: the variant is OFF, the reference ON (seed 004's `EP1→8 03→00`)
    assert by[("03_ep1", "gpu")].configs == "03→00"
    assert by[("03_ep1", "gpu")].throughput_change == pytest.approx(200 / 100 - 1)


def test_a_side_a_variant_does_not_change_has_no_row(trainings: dict) -> None:
    result = compare_matrix(demo_matrix(), trainings, criteria=CRITERIA)
    assert ("02_gpu_only", "npu") not in {(r.variant, r.side) for r in result.rows}
    gpu_only = next(v for v in result.variants if v.name == "02_gpu_only")
    assert (gpu_only.changed_sides, gpu_only.shared_sides) == (("gpu",), ("npu",))


def test_verdicts_are_judged_against_what_each_variant_was_expected_to_show(trainings: dict) -> None:
    result = compare_matrix(demo_matrix(), trainings, criteria=CRITERIA)
    outcome = {v.name: (v.outcome, v.as_expected) for v in result.variants}
    assert outcome == {"01_recompute": ("pass", True), "02_gpu_only": ("pass", True), "03_ep1": ("pass", True),
                       "05_bf16": ("fail", True), "06_oom": ("oom", True)}
    bf16 = next(v for v in result.variants if v.name == "05_bf16")
    assert any("mean_rel(lm_loss)" in r for r in bf16.reasons)
    # expected to pass, the bf16 variant fails the matrix, naming itself and why
    strict = compare_matrix(demo_matrix(**{"05_bf16": {"patch": {}}}), trainings, criteria=CRITERIA)
    assert strict.verdict == "fail"
    assert strict.reasons[0].startswith("05_bf16: fail, expected pass (NPU: |mean_rel(lm_loss)| < 0.001% failed")


def test_a_reference_that_did_not_complete_fails_the_matrix(trainings: dict) -> None:
    ref = trainings["default"]["00_base"]
    broken = {"npu": ref.sides["npu"], "gpu": SideTraining(status=TrainingStatus("exit code unknown"))}
    trainings["default"]["00_base"] = ConfigTrainings("00_base", broken)
    result = compare_matrix(demo_matrix(), trainings, criteria=CRITERIA)
    assert result.verdict == "fail"
    assert "reference 00_base: GPU exit code unknown" in result.reasons


def test_pairs_add_rows_between_two_variants(trainings: dict) -> None:
    m = Matrix.model_validate({**demo_matrix().model_dump(), "pairs": [{"configs": ["01_recompute", "05_bf16"],
                                                                        "switch": "x"}]})
    result = compare_matrix(m, trainings, criteria=CRITERIA)
    extra = [r for r in result.rows if r.variant is None]
    assert {(r.configs, r.side) for r in extra} == {("01→05", "npu"), ("01→05", "gpu")}


def test_the_report_has_the_seeds_tables_charts_and_json(trainings: dict, tmp_path: Path) -> None:
    result = compare_matrix(demo_matrix(), trainings, criteria=CRITERIA, experiment="m")
    titles = [t for t, _, _ in tables(result)]
    assert titles[0].startswith("NPU side: precision and time")  # NPU first, then GPU, as the seed reads
    header = tables(result)[0][1]
    assert header == ["switch", "configs", "loss mean rel. error", "loss max abs. error", "ms/iter off→on",
                      "samples/s off→on", "throughput change", "verdict"]
    files = write_matrix_report(result, tmp_path / "r")
    assert {p.name for p in files.charts} == {"matrix_npu.png", "matrix_gpu.png"}
    md = files.markdown.read_text()
    row = "| Recompute off→on | 00→01 | 0.000000% | 0.000000 | 100.000 → 150.000 | 40.000 → 26.667 | -33.33% | PASS |"
    assert row in md
    assert "| Recompute off→on | 00→01 | 0.683594 → 0.488281 | 0.678711 → 0.483398 | +28.57% | +28.78% |" in md
    assert "| 06_oom | GPU | oom | 1 | 0 |" in md
    # the OOM line whole, not cut mid-path at 160 characters
    assert "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables) (PyTorch CUDA" in md
    # the criteria in the notation the threshold was written in (and the tables and reasons use), not 1e-05
    assert "Criteria of each OFF→ON comparison: |mean_rel(lm_loss)| < 0.001%" in md
    doc = json.loads(files.json.read_text())
    assert [v["name"] for v in doc["variants"]] == ["01_recompute", "02_gpu_only", "03_ep1", "05_bf16", "06_oom"]
    rows = artifact_rows(doc)
    assert {r["variant"] for r in rows} == {"01_recompute", "02_gpu_only", "03_ep1", "05_bf16", "06_oom"}
    assert next(r for r in rows if r["variant"] == "06_oom")["verdict"] == "OOM"
    assert "06_oom" in markdown(result)


def test_config_numbers_are_the_seeds() -> None:
    assert (short_name("01_ring_cp2"), short_name("baseline"), short_name("a_b")) == ("01", "baseline", "a_b")


def timed(load: float, cpus: int = 2) -> TimingConditions:
    return TimingConditions(device="CPU", machine="vm", measured_in="r", load_1m=load, cpus=cpus)


def test_speed_changes_timed_on_a_loaded_host_say_so_with_the_load(trainings: dict) -> None:
    """Issue 47: `+1104 %` measured on a loaded machine, printed as a fact. The single-run report's rule (a 1-minute
    load of at least one per CPU when the run started) marks each change a loaded training enters, and names the
    load."""
    t = trainings["default"]
    recompute = t["01_recompute"].sides["gpu"]
    t["01_recompute"] = ConfigTrainings("01_recompute", {
        **t["01_recompute"].sides, "gpu": dataclasses.replace(recompute, timing=timed(5.9))})
    for name in ("00_base", "03_ep1"):  # calm hosts: their changes stand
        t[name] = ConfigTrainings(name, {s: dataclasses.replace(tr, timing=timed(0.4))
                                         for s, tr in t[name].sides.items()})
    result = compare_matrix(demo_matrix(), trainings, criteria=CRITERIA, experiment="m")
    md = markdown(result)
    assert "| Recompute off→on | 00→01 | 0.000000% | 0.000000 | 100.000 → 150.000 | 40.000 → 26.667 | " \
           "-33.33% unreliable (loaded host) | PASS |" in md
    assert "| EP1→8 | 03→00 | 0.000000% | 0.000000 | 200.000 → 100.000 | 20.000 → 40.000 | +100.00% | PASS |" in md
    assert "Timings unreliable: 1 of 4 training(s) ran on a loaded host" in md
    assert "01_recompute GPU: load 5.90 on 2 CPU(s) (loaded)" in md
    assert "| 00_base | NPU | completed | 0 | 12 | — | — | — | 100.0 / 100.0 | 0.40 on 2 CPU(s) |" in md
    assert "<td class=unreliable>-33.33% unreliable (loaded host)</td>" in html_page(result)
    doc = result.to_json()
    assert [r["timing_unreliable"] for r in doc["rows"] if r["variant"] == "01_recompute"] == [False, True]
    assert next(r for r in artifact_rows(doc) if r["variant"] == "01_recompute" and r["side"] == "GPU")[
        "throughput change"] == "-33.33% unreliable (loaded host)"
    calm = compare_matrix(demo_matrix(), {"default": {**t, "01_recompute": ConfigTrainings(
        "01_recompute", {**t["01_recompute"].sides, "gpu": recompute})}}, criteria=CRITERIA)
    assert "unreliable" not in markdown(calm)


def test_a_failure_the_variant_was_expected_to_show_is_not_red(trainings: dict) -> None:
    """Issue 47: the bf16 write-back's FAIL and the capacity probe's OOM were red rows under `PASS`; shown as what
    they are — expected — in a neutral colour. A failure nobody expected stays red."""
    result = compare_matrix(demo_matrix(), trainings, criteria=CRITERIA, experiment="m")
    assert result.verdict == "pass"
    page = html_page(result)
    assert "class='fail'" not in page
    assert "<tr class='expected'><td>bf16 write-back off→on</td>" in page
    assert "<tr class='expected'><td>default</td><td>06_oom</td><td>capacity</td><td>OOM as expected</td>" in page
    assert "| default | 05_bf16 | bf16 write-back off→on | FAIL as expected | fail | yes |" in markdown(result)
    strict = compare_matrix(demo_matrix(**{"05_bf16": {"patch": {}}}), trainings, criteria=CRITERIA)
    page = html_page(strict)
    assert "<tr class='fail'><td>05_bf16</td><td>00→05</td>" in page  # its switch: its name, without `switch:`
    assert "<tr class='fail'><td>default</td><td>05_bf16</td><td>05_bf16</td><td>FAIL</td>" in page
