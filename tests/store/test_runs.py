"""Experiments, runs, step runs and artifacts: created, read back, never overwritten (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC

import numpy as np
import pytest

from alignflow.errors import ImmutableRecord, RecordNotFound, StoreError
from alignflow.store import PASS_VERDICT, RunStatus, StepStatus, Store
from alignflow.store import base as store_base
from tests.store.sample import BASE, CONFIG, CONFIG_SHA, SHA_B, SHA_C, run_params


def _run(store: Store, **kw: object) -> str:
    store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    args: dict[str, object] = {"trigger": "cli", "code_version": "git:1234abcd", "params": run_params(), **kw}
    return store.create_run("demo", **args).id  # type: ignore[arg-type]


def _step(store: Store, run_id: str, step: str = "convert_bf16", key: str = "k1") -> str:
    return store.start_step(run_id, step, host="cpu", command="python -m convert --in a --out b", cache_key=key,
                            inputs={"base_ckpt": BASE}).id


# --- experiments --------------------------------------------------------------------------------------------------


def test_ensure_experiment_is_idempotent_and_keeps_every_config_version(store: Store) -> None:
    first = store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    again = store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    assert (again.id, again.config_sha256, again.config) == (first.id, CONFIG_SHA, CONFIG)
    changed = store.ensure_experiment("demo", config={**CONFIG, "seed": 2}, config_sha256=SHA_B)
    assert changed.id == first.id
    assert store.get_experiment("demo").config_sha256 == SHA_B
    assert store.experiment_config("demo", CONFIG_SHA) == CONFIG  # the old version is still there


def test_a_run_records_the_config_version_it_ran_with(store: Store) -> None:
    store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    old = store.create_run("demo", trigger="cli", code_version="v1", params=run_params())
    store.ensure_experiment("demo", config={**CONFIG, "seed": 2}, config_sha256=SHA_B)
    new = store.create_run("demo", trigger="cli", code_version="v1", params=run_params())
    pinned = store.create_run("demo", trigger="cli", code_version="v1", params=run_params(), config_sha256=CONFIG_SHA)
    assert (old.config_sha256, new.config_sha256, pinned.config_sha256) == (CONFIG_SHA, SHA_B, CONFIG_SHA)


def test_a_run_of_an_unknown_experiment_names_the_known_ones(store: Store) -> None:
    store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    with pytest.raises(RecordNotFound, match="experiment 'dem0': not in the store; recorded experiments: demo"):
        store.create_run("dem0", trigger="cli", code_version="v1", params=run_params())


def test_a_bad_config_digest_is_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="config_sha256: 'ABC' is not a sha256 digest"):
        store.ensure_experiment("demo", config=CONFIG, config_sha256="ABC")


# --- runs ---------------------------------------------------------------------------------------------------------


def test_create_and_read_a_run(store: Store) -> None:
    params = run_params(trigger="schedule", only=("gpu_train",))
    run = store.create_run(
        store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA).name,
        trigger="schedule", code_version="git:1234abcd", params=params,
    )
    assert len(run.id) == 12
    assert run.status == RunStatus.RUNNING
    assert run.finished_at is None
    assert run.duration_s is None
    assert run.started_at.tzinfo is not None
    assert run.started_at.utcoffset() == UTC.utcoffset(None)
    got = store.get_run(run.id)
    assert got == run
    assert got.params == params
    assert got.stored_params["version"] == 2
    assert got.experiment_file == params.experiment_path


def test_a_unique_prefix_finds_a_run_and_an_ambiguous_one_lists_the_matches(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = iter(["abcd00000001", "abcdf0000002"])
    monkeypatch.setattr(store_base, "new_id", lambda: next(ids))
    first = _run(store)
    second = _run(store)
    assert store.get_run("abcd00000001").id == first
    assert store.get_run("abcdf").id == second
    with pytest.raises(RecordNotFound, match="'abcd': ambiguous prefix, matches abcd00000001, abcdf0000002"):
        store.get_run("abcd")
    with pytest.raises(RecordNotFound, match="'abcf': no such id"):
        store.get_run("abcf")
    with pytest.raises(RecordNotFound, match="'ab': not an id"):
        store.get_run("ab")
    with pytest.raises(RecordNotFound, match="not an id"):
        store.get_run("'; DROP TABLE runs; --")


def test_finish_run_records_status_verdict_report_and_duration(store: Store) -> None:
    run_id = _run(store)
    done = store.finish_run(run_id, status="completed", verdict=PASS_VERDICT, report="reports/r1/index.html")
    assert (done.status, done.verdict, done.report) == (RunStatus.COMPLETED, "pass", "reports/r1/index.html")
    assert done.duration_s == 1.0  # the ticking clock: one second between start and finish
    assert store.get_run(run_id) == done


def test_a_finished_run_cannot_be_finished_again_or_changed(store: Store) -> None:
    run_id = _run(store)
    done = store.finish_run(run_id, status="failed", error="gpu_train: exited 1")
    with pytest.raises(ImmutableRecord, match=f"run {run_id}: is failed; cannot finish a finished run"):
        store.finish_run(run_id, status="completed", verdict="pass")
    with pytest.raises(ImmutableRecord, match="cannot start step gpu_train in a finished run"):
        _step(store, run_id, "gpu_train")
    with pytest.raises(ImmutableRecord):
        store.add_snapshot(run_id, "cuda", {"torch": "2.13"})
    with pytest.raises(ImmutableRecord):
        store.skip_step(run_id, "compare", reason="late")
    assert store.get_run(run_id) == done
    assert store.steps(run_id) == []


def test_completing_a_run_with_open_steps_is_refused(store: Store) -> None:
    run_id = _run(store)
    _step(store, run_id, "gpu_train")
    with pytest.raises(StoreError, match="cannot be completed while steps are open: gpu_train \\(running\\)"):
        store.finish_run(run_id, status="completed", verdict="pass")
    assert store.get_run(run_id).status == RunStatus.RUNNING


def test_a_cancelled_run_closes_its_open_steps_as_cancelled(store: Store) -> None:
    run_id = _run(store)
    step_id = _step(store, run_id, "gpu_train")
    store.finish_run(run_id, status="cancelled")
    step = store.get_step(step_id)
    assert step.status == StepStatus.CANCELLED
    assert step.error == f"run {run_id} ended (cancelled) while this step was running"
    assert step.finished_at is not None


def test_a_failed_run_closes_its_open_steps_as_failed(store: Store) -> None:
    run_id = _run(store)
    step_id = _step(store, run_id, "gpu_train")
    store.finish_run(run_id, status="failed", error="the controller lost its host")
    assert store.get_step(step_id).status == StepStatus.FAILED


def test_finish_run_rejects_a_status_that_is_not_final(store: Store) -> None:
    run_id = _run(store)
    with pytest.raises(ValueError, match="status must be one of"):
        store.finish_run(run_id, status="running")


def test_list_runs_is_newest_first_and_filters_by_experiment(store: Store) -> None:
    a1 = _run(store)
    store.ensure_experiment("other", config={}, config_sha256=SHA_C)
    b1 = store.create_run("other", trigger="cli", code_version="v", params=run_params("other")).id
    a2 = _run(store, parent_id=a1)
    assert [r.id for r in store.list_runs()] == [a2, b1, a1]
    assert [r.id for r in store.list_runs(experiment="demo")] == [a2, a1]
    assert [r.id for r in store.list_runs(limit=1)] == [a2]
    assert [r.id for r in store.list_runs(status="running")] == [a2, b1, a1]
    assert store.get_run(a2).parent_id == a1
    assert [r.id for r in store.children(a1)] == [a2]


def test_last_passing_run_skips_failures_and_honours_before(store: Store) -> None:
    passed_old = _run(store)
    store.finish_run(passed_old, status="completed", verdict="pass")
    passed_new = _run(store)
    store.finish_run(passed_new, status="completed", verdict="pass")
    failing = _run(store)
    store.finish_run(failing, status="completed", verdict="fail")
    crashed = _run(store)
    store.finish_run(crashed, status="crashed", verdict="pass")
    current = _run(store)
    assert store.last_passing_run("demo") is not None
    assert store.last_passing_run("demo").id == passed_new  # type: ignore[union-attr]
    assert store.last_passing_run("demo", before=current).id == passed_new  # type: ignore[union-attr]
    assert store.last_passing_run("demo", before=passed_new).id == passed_old  # type: ignore[union-attr]
    assert store.last_passing_run("demo", before=passed_old) is None


def test_params_that_are_not_json_are_refused_naming_the_key(store: Store) -> None:
    store.ensure_experiment("demo", config=CONFIG, config_sha256=CONFIG_SHA)
    params = run_params()
    criterion = params.experiment.criteria[0].model_copy(update={"threshold": float("nan")})
    nan = params.model_copy(update={"experiment": params.experiment.model_copy(update={"criteria": [criterion]})})
    with pytest.raises(StoreError, match=r"params\['experiment'\]\['criteria'\]\[0\]\['threshold'\]: nan cannot be "
                                         "stored in JSON"):
        store.create_run("demo", trigger="cli", code_version="v", params=nan)
    run = store.create_run("demo", trigger="cli", code_version="v", params=params)
    step = store.start_step(run.id, "gpu_train", host="cuda", command="c", cache_key="k", inputs={})
    with pytest.raises(StoreError, match=r"job handle\['when'\]: a set is not JSON"):
        store.attach_job(step.id, job_dir="j", handle={"when": {1}})
    with pytest.raises(StoreError, match="key 1 is not a string"):
        store.attach_job(step.id, job_dir="j", handle={1: "x"})
    with pytest.raises(StoreError, match=r"job handle\['n'\]: inf cannot be stored in JSON"):
        store.attach_job(step.id, job_dir="j", handle={"n": np.float64("inf")})
    assert [r.id for r in store.list_runs()] == [run.id]
    assert store.get_step(step.id).job_handle is None


# --- step runs ----------------------------------------------------------------------------------------------------


def test_a_step_run_records_its_job_and_its_end(store: Store) -> None:
    run_id = _run(store)
    step_id = _step(store, run_id)
    started = store.get_step(step_id)
    assert (started.status, started.host, started.cache_key, started.input_ref("base_ckpt")) == (
        StepStatus.RUNNING, "cpu", "k1", BASE)
    assert started.inputs["base_ckpt"] == {"name": "base_ckpt", "host": "ascend", "path": "/w/ascend/artifacts/base",
                                           "sha256": SHA_B, "size": 2048, "kind": "checkpoint",
                                           "manifest": [["model.safetensors", SHA_B, 2048]]}
    handle = {"host": "cpu", "job_dir": "jobs/7f3a", "pid": 4242, "pgid": 4242}
    assert store.attach_job(step_id, job_dir="jobs/7f3a", handle=handle).job_handle == handle
    done = store.finish_step(step_id, status="ran", exit_code=0, stdout_tail="step 10 loss 2.1\n", stderr_tail="")
    assert (done.status, done.exit_code, done.job_dir, done.stdout_tail) == (
        StepStatus.RAN, 0, "jobs/7f3a", "step 10 loss 2.1\n")
    assert done.duration_s is not None
    assert done.duration_s > 0
    assert store.steps(run_id) == [done]


def test_a_job_is_attached_once(store: Store) -> None:
    step_id = _step(store, _run(store))
    store.attach_job(step_id, job_dir="jobs/1", handle={"pid": 1})
    with pytest.raises(ImmutableRecord, match="already has job jobs/1; a second job needs a new step run"):
        store.attach_job(step_id, job_dir="jobs/2", handle={"pid": 2})
    assert store.get_step(step_id).job_handle == {"pid": 1}


def test_a_finished_step_run_cannot_change(store: Store) -> None:
    step_id = _step(store, _run(store))
    done = store.finish_step(step_id, status="failed", exit_code=3, stdout_tail="", stderr_tail="Traceback ...",
                             error="cpu: `python -m convert` exited 3")
    with pytest.raises(ImmutableRecord, match=r"step run \w+ \(convert_bf16\): is failed; cannot finish"):
        store.finish_step(step_id, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    with pytest.raises(ImmutableRecord):
        store.attach_job(step_id, job_dir="jobs/x", handle={})
    with pytest.raises(ImmutableRecord, match="cannot add artifact 'bf16_ckpt' to a finished step run"):
        store.add_artifact(step_id, name="bf16_ckpt", host="cpu", path="out", kind="dir", sha256=SHA_C,
                           size_bytes=1)
    assert store.get_step(step_id) == done


def test_a_pending_step_run_starts_later(store: Store) -> None:
    run_id = _run(store)
    pending = store.start_step(run_id, "gpu_train", host="cuda", command="torchrun ...", cache_key="k",
                               inputs={}, status="pending")
    assert (pending.status, pending.started_at) == (StepStatus.PENDING, None)
    running = store.mark_running(pending.id)
    assert running.status == StepStatus.RUNNING
    assert running.started_at is not None
    with pytest.raises(ImmutableRecord, match="is running, not pending"):
        store.mark_running(pending.id)


def test_skip_step_records_the_reason(store: Store) -> None:
    run_id = _run(store)
    skipped = store.skip_step(run_id, "gpu_train", reason="upstream convert_megatron failed")
    assert (skipped.status, skipped.error, skipped.host) == (StepStatus.SKIPPED, "upstream convert_megatron failed",
                                                             None)


def test_log_tails_keep_their_end_and_lose_nul_characters(store: Store) -> None:
    step_id = _step(store, _run(store))
    long = "x" * 100_000 + "THE END\n"
    done = store.finish_step(step_id, status="ran", exit_code=0, stdout_tail=long, stderr_tail="bad\x00byte")
    assert done.stdout_tail is not None
    assert len(done.stdout_tail) == 64 * 1024
    assert done.stdout_tail.endswith("THE END\n")
    assert done.stderr_tail == "bad\ufffdbyte"


# --- cache --------------------------------------------------------------------------------------------------------


def test_find_cached_step_returns_the_newest_step_run_that_ran(store: Store) -> None:
    assert store.find_cached_step("convert_bf16", "k1") is None
    r1 = _run(store)
    ran_old = _step(store, r1)
    store.finish_step(ran_old, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    ran_new = _step(store, r1)
    store.finish_step(ran_new, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    failed = _step(store, r1)
    store.finish_step(failed, status="failed", exit_code=1, stdout_tail="", stderr_tail="")
    _step(store, r1)  # still running
    other_key = _step(store, r1, key="k2")
    store.finish_step(other_key, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    found = store.find_cached_step("convert_bf16", "k1")
    assert found is not None
    assert found.id == ran_new
    assert store.find_cached_step("convert_megatron", "k1") is None


def test_a_cached_step_points_at_its_source_and_lists_its_artifacts(store: Store) -> None:
    r1 = _run(store)
    source = _step(store, r1)
    art = store.add_artifact(source, name="bf16_ckpt", host="cpu", path="runs/r1/bf16", kind="dir", sha256=SHA_C,
                             size_bytes=2048, manifest=[["model.safetensors", SHA_C, 2048]])
    store.finish_step(source, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    store.finish_run(r1, status="completed", verdict="pass")
    r2 = _run(store, parent_id=r1, trigger="rerun")
    cached = store.record_cached_step(r2, "convert_bf16", host="cpu", command="python -m convert --in a --out b",
                                      cache_key="k1", reused_from=source[:6])
    assert (cached.status, cached.reused_from, cached.run_id) == (StepStatus.CACHED, source, r2)
    assert cached.inputs == store.get_step(source).inputs  # what it read is what its source read
    [copy] = store.artifacts(cached.id)
    assert (copy.name, copy.host, copy.path, copy.sha256, copy.size_bytes, copy.manifest) == (
        art.name, art.host, art.path, art.sha256, art.size_bytes, art.manifest)
    assert copy.id != art.id
    assert copy.step_run_id == cached.id
    assert store.find_cached_step("convert_bf16", "k1").id == source  # type: ignore[union-attr]
    assert [a.step_run_id for a in store.artifacts_by_sha256(SHA_C)] == [source, cached.id]


def test_only_a_step_run_of_the_same_step_and_key_that_ran_can_be_reused(store: Store) -> None:
    r1 = _run(store)
    failed = _step(store, r1)
    store.finish_step(failed, status="failed", exit_code=1, stdout_tail="", stderr_tail="")
    ran = _step(store, r1)
    store.finish_step(ran, status="ran", exit_code=0, stdout_tail="", stderr_tail="")
    for source, step, key in ((failed, "convert_bf16", "k1"), (ran, "convert_bf16", "k2"), (ran, "gpu_train", "k1")):
        with pytest.raises(StoreError, match="only a step run of the same step and cache key that ran can be reused"):
            store.record_cached_step(r1, step, host="cpu", command="c", cache_key=key, reused_from=source)
    assert [s.id for s in store.steps(r1)] == [failed, ran]


# --- artifacts ----------------------------------------------------------------------------------------------------


def test_artifacts_are_recorded_once_per_name_with_their_fingerprint(store: Store) -> None:
    run_id = _run(store)
    step_id = _step(store, run_id)
    log = store.add_artifact(step_id, name="log", host="cpu", path="jobs/1/stdout.log", kind="file", sha256=SHA_B,
                             size_bytes=10)
    ckpt = store.add_artifact(step_id, name="bf16_ckpt", host="cpu", path="out/bf16", kind="dir", sha256=SHA_C,
                              size_bytes=3 * 2**40, manifest={"files": [["a", SHA_B, 1]]})
    assert store.artifacts(step_id) == [log, ckpt]
    assert store.run_artifacts(run_id) == [log, ckpt]
    assert ckpt.size_bytes == 3 * 2**40  # 64-bit sizes
    with pytest.raises(ImmutableRecord, match="already has an artifact named 'log'"):
        store.add_artifact(step_id, name="log", host="cpu", path="other", kind="file", sha256=SHA_C, size_bytes=1)
    with pytest.raises(StoreError, match="is not a sha256 digest"):
        store.add_artifact(step_id, name="x", host="cpu", path="p", kind="file", sha256="f" * 63, size_bytes=1)
    with pytest.raises(StoreError, match="size_bytes -1 must be a non-negative integer"):
        store.add_artifact(step_id, name="x", host="cpu", path="p", kind="file", sha256=SHA_B, size_bytes=-1)
    assert store.artifacts(step_id) == [log, ckpt]
