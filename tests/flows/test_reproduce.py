"""`alignflow reproduce`'s judgement of a differing training log: bookkeeping columns are not a divergence."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
import pytest

from alignflow.logs import parse_log
from alignflow.logs.schema import BOOKKEEPING_COLUMNS
from alignflow.runner.reproduce import _log_note
from alignflow.store import ArtifactRef
from tests.logfixtures import make_run, megatron_lines
from tests.store.sample import run_params


@dataclass(frozen=True)
class _StepRun:
    id: str
    run_id: str
    reused_from: str | None = None


class _Store:
    """Just enough of the store for `_log_note`: each run's metrics as the engine records them (long rows)."""

    def __init__(self, frames: dict[str, pd.DataFrame]) -> None:
        self._frames = frames

    def metrics(self, run_id: str) -> pd.DataFrame:
        wide = self._frames[run_id].copy()
        wide.index.name = "step"
        long = wide.reset_index().melt(id_vars="step", var_name="metric", value_name="value")
        long["step_run_id"] = f"sr-{run_id}"
        return long.astype({"value": "float64"})

    def get_step(self, step_run_id: str) -> Any:  # pragma: no cover - no step here is cached
        raise AssertionError(step_run_id)


def _parsed(run: Any) -> pd.DataFrame:
    return parse_log([line.rstrip("\n") for line in megatron_lines(run)], fmt="megatron").frame


def _note(a: pd.DataFrame, b: pd.DataFrame) -> tuple[str, bool]:
    store = _Store({"a": a, "b": b})
    return _log_note(store, _StepRun("sr-a", "a"), _StepRun("sr-b", "b"))


def test_logs_differing_only_in_timings_and_sample_counters_are_timing_only() -> None:
    run = make_run(6, step_time_ms=700.0)
    a = _parsed(run)
    b = _parsed(replace(run, step_time_ms=[t * 1.7 for t in run.step_time_ms], global_batch_size=16))
    differing = {c for c in a.columns if not a[c].equals(b[c])}
    # the two logs really differ, in canonical bookkeeping columns only
    assert {"step_time_ms", "consumed_samples", "global_batch_size"} <= differing <= BOOKKEEPING_COLUMNS
    assert "throughput_tflops" in BOOKKEEPING_COLUMNS
    note, substantive = _note(a, b)
    assert substantive is False
    assert note.startswith("timing only"), note


def test_a_differing_loss_is_substantive() -> None:
    run = make_run(6)
    a = _parsed(run)
    b = _parsed(replace(run, lm_loss=[v + 0.01 for v in run.lm_loss],
                        step_time_ms=[t + 3.0 for t in run.step_time_ms]))
    note, substantive = _note(a, b)
    assert substantive is True
    assert note.startswith("logged metrics differ: "), note
    assert "lm_loss" in note, note
    assert "step_time_ms" not in note


# ---- the verdict and the cause of each difference, on a real store -------------------------------------------

# The pipeline's steps as recorded (alignflow.pipeline), the optional early gate left out.
GRAPH = (("npu_base_train", ("data",), ("base_ckpt",)), ("convert_bf16", ("base_ckpt",), ("bf16_ckpt",)),
         ("convert_megatron", ("bf16_ckpt",), ("megatron_ckpt",)),
         ("gpu_train", ("data", "megatron_ckpt"), ("gpu_log",)),
         ("npu_reload_train", ("data", "bf16_ckpt"), ("npu_log",)))
DATA = ArtifactRef(name="data", host="cpu", path="/w/data.bin", sha256="d" * 64, size=1, kind="file")


def _record(store: Any, shas: dict[str, str], *, keys: dict[str, str] | None = None,
            torch: str = "2.6.0", metrics: pd.DataFrame | None = None, commands: dict[str, str] | None = None
            ) -> str:
    """A finished run whose steps produce `shas` (artifact -> sha256); each step's inputs are its upstream outputs;
    `metrics`: what both trainings logged (recorded as the engine records a parsed log)."""
    run = store.create_run("demo", trigger="cli", code_version="v1", params=run_params())
    store.add_snapshot(run.id, "cuda", {"host": "cuda", "taken_at": "now", "packages": {"torch": torch}})
    made: dict[str, ArtifactRef] = {"data": DATA}
    for step, needs, outputs in GRAPH:
        inputs = {n: made[n] for n in needs}
        key = (keys or {}).get(step) or "k-" + step + "-" + "-".join(v.sha256[:4] for v in inputs.values())
        sr = store.start_step(run.id, step, host="cpu", command=(commands or {}).get(step, step), cache_key=key,
                              inputs=inputs)
        for name in outputs:
            kind = "log" if name.endswith("_log") else "dir"
            store.add_artifact(sr.id, name=name, host="cpu", path=f"/w/{name}", kind=kind, sha256=shas[name],
                               size_bytes=1)
            made[name] = ArtifactRef(name=name, host="cpu", path=f"/w/{name}", sha256=shas[name], size=1, kind=kind)
        if metrics is not None and step in ("gpu_train", "npu_reload_train"):
            store.add_metrics(run.id, source=step.split("_")[0], frame=metrics, step_run_id=sr.id)
        store.finish_step(sr.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    logs = {n: made[n] for n in ("npu_log", "gpu_log")}
    sr = store.start_step(run.id, "compare", host="controller", command="compare", inputs=logs,
                          cache_key="k-compare-" + "-".join(v.sha256[:4] for v in logs.values()))
    store.finish_step(sr.id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    store.finish_run(run.id, status="completed", verdict="pass")
    return str(run.id)


SHAS = {"base_ckpt": "1" * 64, "bf16_ckpt": "2" * 64, "megatron_ckpt": "3" * 64, "gpu_log": "4" * 64,
        "npu_log": "5" * 64}


@pytest.fixture
def store(tmp_path: Any) -> Any:
    from alignflow.store import Store
    from tests.store.sample import TickingClock

    with Store.open(f"sqlite:///{tmp_path / 'store.sqlite'}", clock=TickingClock()) as s:
        s.ensure_experiment("demo", config={}, config_sha256="a" * 64)
        yield s


def test_identical_outputs_are_reproduced_even_when_the_host_changed(store: Any) -> None:
    from alignflow.runner.reproduce import judge_reproduction

    a, b = _record(store, SHAS), _record(store, SHAS, torch="2.6.1")
    judged = judge_reproduction(store, a, b)
    assert judged.verdict == "reproduced"
    assert judged.headline.startswith(f"REPRODUCED: run {b} gives every checkpoint")
    (env,) = judged.differences
    assert env.what == "cuda: snapshot packages.torch"
    assert not env.substantive
    assert env.note == "host environment changed; every output is the same"


def test_a_nondeterministic_step_is_the_cause_and_what_follows_inherits_it(store: Any) -> None:
    from alignflow.runner.reproduce import judge_reproduction

    a = _record(store, SHAS)
    b = _record(store, {**SHAS, "base_ckpt": "9" * 64, "bf16_ckpt": "8" * 64, "npu_log": "7" * 64}, torch="2.6.1")
    judged = judge_reproduction(store, a, b)
    assert judged.verdict == "diverged"
    assert judged.headline.startswith("DIVERGED: ")
    assert "the first at step npu_base_train: npu_base_train: base_ckpt sha256 (same inputs and recipe: the step " \
           "is not deterministic)" in judged.headline
    causes = {d.what: (d.note, d.substantive) for d in judged.differences}
    assert causes["convert_bf16: input base_ckpt sha256"] == (
        "output of step npu_base_train, which differs (above)", True)
    assert causes["convert_bf16: bf16_ckpt sha256"] == ("its inputs differ (base_ckpt)", True)
    assert causes["convert_bf16: cache key (command, config, code, inputs)"] == (
        "its inputs changed (base_ckpt)", False)
    # issue 20: the compare step's key changed because both logs are its inputs, not because of the code
    compare_key = causes["compare: cache key (command, config, code, inputs)"]
    assert compare_key == ("its inputs changed (npu_log)", False)
    assert causes["cuda: snapshot packages.torch"] == ("host environment changed: a candidate cause of the "
                                                      "divergence", False)


def test_a_changed_recipe_with_the_same_inputs_is_named_as_such(store: Any) -> None:
    from alignflow.runner.reproduce import judge_reproduction

    a = _record(store, SHAS)
    b = _record(store, {**SHAS, "megatron_ckpt": "6" * 64, "gpu_log": "6" * 64},
                keys={"convert_megatron": "another-spec"})
    causes = {d.what: d.note for d in judge_reproduction(store, a, b).differences}
    assert causes["convert_megatron: megatron_ckpt sha256"] == (
        "a config file, the environment or the code version changed (the command and inputs are the same)")
    assert causes["gpu_train: input megatron_ckpt sha256"] == \
        "output of step convert_megatron, which differs (above)"


def test_logs_that_differ_in_timestamps_only_are_named_as_the_cause_not_the_recipe(store: Any) -> None:
    # issue 40: a reproduction whose only difference is the trainings' timestamps blamed "the command, a config
    # file or the code" for the compare step's new cache key (its inputs are the two logs)
    from alignflow.runner.reproduce import judge_reproduction

    measured = _parsed(make_run(6))
    a = _record(store, SHAS, metrics=measured)
    b = _record(store, {**SHAS, "gpu_log": "6" * 64, "npu_log": "7" * 64}, metrics=measured)
    judged = judge_reproduction(store, a, b)
    assert judged.verdict == "reproduced", judged.headline
    causes = {d.what: (d.note, d.substantive) for d in judged.differences}
    assert causes["gpu_train: gpu_log sha256"][0].startswith("timing only")
    assert causes["compare: cache key (command, config, code, inputs)"] == (
        "its inputs differ in timings only (gpu_log, npu_log): the logs' bytes, not what they measured; its "
        "command, config and code are not known to differ", False)
    assert not any("command" in note and "changed" in note for note, _ in causes.values()), causes


def test_a_changed_command_is_named_with_what_changed(store: Any) -> None:
    from alignflow.runner.reproduce import judge_reproduction

    a = _record(store, SHAS)
    b = _record(store, {**SHAS, "megatron_ckpt": "6" * 64, "gpu_log": "6" * 64},
                keys={"convert_megatron": "another-spec"}, commands={"convert_megatron": "convert_megatron --spec x"})
    causes = {d.what: d.note for d in judge_reproduction(store, a, b).differences}
    assert causes["convert_megatron: megatron_ckpt sha256"] == "the command changed ((nothing) -> --spec)"
