"""What a run's report says of the run around the comparison (issue 40, item 4): the step that wrote it is shown
finished, and a speed ratio is given only between sides timed alike — read from the files the compare step wrote."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from alignflow.runview import RunView, run_view, timing_conditions
from alignflow.store import Store
from tests.runner.conftest import FakeLab
from tests.store.sample import run_params


def _files(view: RunView) -> tuple[str, str, dict[str, object]]:
    assert view.report is not None
    report = Path(view.report)
    return (report.read_text(), (report.parent / "summary.md").read_text(),
            json.loads((report.parent / "comparison.json").read_text()))


def test_the_report_shows_the_step_that_wrote_it_finished_and_a_speed_ratio_only_between_alike_timings(
        lab: FakeLab) -> None:
    first = lab.run()
    assert first.status == "completed", first.error
    page, md, _ = _files(first)
    steps = md[md.index("## Run steps"):]
    assert re.search(r"^\| compare \| ran \| controller \| [0-9.]+ s \| 0 \| wrote this report \|$", steps, re.M), steps
    assert "running" not in steps
    table = page[page.index('id="steps-table"'):page.index("</table>", page.index('id="steps-table"'))]
    assert "running" not in table
    assert re.search(r"<td[^>]*>compare</td><td[^>]*>ran</td>", table)
    # both sides trained in this run, each alone on its machine: a ratio, saying so
    assert "NPU timed: CPU (no npu-smi, no nvidia-smi on the host) on fake-ascend; timed in run " \
           f"{first.run_id}; alone on its machine among the run's steps" in md
    assert "NPU and GPU are equally fast (samples/s: NPU 400, GPU 400; timed alike)" in md
    # the GPU side trained again, the NPU side's log reused from the first run: timed in two runs, no ratio
    second = lab.run(force=("gpu_train", "compare"))
    assert {s.step: s.status for s in second.steps}["npu_reload_train"] == "cached"
    page, md, doc = _files(second)
    refusal = (f"no speed ratio: the two sides were not timed alike: timed in different runs (NPU in run "
               f"{first.run_id} (cached), GPU in run {second.run_id})")
    assert refusal in md
    assert refusal in page
    assert "faster" not in md
    timing = doc["timing"]
    assert isinstance(timing, dict)
    assert timing["sides"]["NPU"]["cached"] is True
    assert timing["sides"]["NPU"]["measured_in"] == first.run_id
    assert timing["sides"]["GPU"]["measured_in"] == second.run_id
    assert refusal in timing["speed"]


class _Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_trainings_that_share_a_machine_are_timed_beside_each_other(tmp_path: Path) -> None:
    """Two hosts of the inventory on one machine (the twin's local hosts): the NPU training ran entirely beside
    the GPU one, which ran a third of its time alone; the host was loaded. No ratio between such timings."""
    clock = _Clock()
    with Store.open(f"sqlite:///{tmp_path / 'store.sqlite'}", clock=clock) as store:
        store.ensure_experiment("demo", config={"name": "demo"}, config_sha256="a" * 64)
        run = store.create_run("demo", trigger="cli", code_version="t", params=run_params())
        for host in ("ascend", "cuda"):
            store.add_snapshot(run.id, host, {"host": host, "hostname": "vm", "cpus": 2, "load": [3.5, 3.0, 2.5],
                                              "accelerators": {"npu-smi": {"present": False},
                                                               "nvidia-smi": {"present": False}}})
        gpu = store.start_step(run.id, "gpu_train", host="cuda", command="t", cache_key="g", inputs={})
        clock.now += timedelta(seconds=1)
        npu = store.start_step(run.id, "npu_reload_train", host="ascend", command="t", cache_key="n", inputs={})
        clock.now += timedelta(seconds=200)
        store.finish_step(npu.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
        clock.now += timedelta(seconds=100)
        store.finish_step(gpu.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
        timing = timing_conditions(store, run_view(store, run.id))
    assert timing["NPU"].beside == ("gpu_train",)
    assert timing["NPU"].shared == 1.0
    assert timing["GPU"].shared is not None
    assert abs(timing["GPU"].shared - 200 / 301) < 1e-9
    assert timing["NPU"].loaded is True
    assert timing["NPU"].describe() == ("CPU (no npu-smi, no nvidia-smi on the host) on vm; timed in run "
                                        f"{run.id}; beside gpu_train on the same machine for 100% of its time; "
                                        "load 3.50 on 2 CPU(s) when the run started (loaded)")
