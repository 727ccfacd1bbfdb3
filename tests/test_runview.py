"""One record view (issue 20): `run_view`, `alignflow show RUN` (= `history RUN`), one JSON schema for show, run
and rerun, tables that fit the terminal, and what the report shows of a run (`report_context`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow import pipeline
from alignflow.cli import app
from alignflow.errors import AlignflowError
from alignflow.runview import SCHEMA_VERSION, report_context, run_view
from alignflow.store import Store
from tests.recorded_run import DATA_SHA, Recorded, record_run

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return record_run(tmp_path_factory.mktemp("run"), fail_step=None)


def _invoke(args: list[str], url: str, columns: int = 100) -> tuple[int, str, str]:
    result = runner.invoke(app, args, env={"ALIGNFLOW_DB_URL": url, "COLUMNS": str(columns)})
    if isinstance(result.exception, AlignflowError):  # as `alignflow.cli.main` prints and exits
        return result.exception.exit_code, result.stdout, f"error: {result.exception}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_the_view_lists_steps_in_pipeline_order_with_the_judged_criteria(recorded: Recorded) -> None:
    with Store.open(recorded.url) as store:
        view = run_view(store, recorded.run_id[:6])
        recorded_order = [s.step for s in store.steps(recorded.run_id)]
    order = [s.step for s in view.steps]
    assert recorded_order.index("npu_reload_train") < recorded_order.index("gpu_train")
    assert order == [s for s in pipeline.STEP_NAMES if s in order]
    assert (view.status, view.verdict, view.trigger) == ("completed", "fail", "cli")
    me = view.criteria[0]
    assert me.label == "|me(lm_loss)| < 0.001"
    assert not me.passed
    assert me.value_text.startswith("+0.00")
    assert me.threshold_text == "0.001"
    assert me.first_outside == 1
    assert len(me.driving_steps) == 5
    assert view.criteria[2].threshold_text == "0.5%"


def test_show_json_history_json_and_run_json_are_one_schema(recorded: Recorded) -> None:
    code, shown, _ = _invoke(["show", recorded.run_id, "--json"], recorded.url)
    assert code == 0
    doc = json.loads(shown)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["run_id"] == recorded.run_id
    assert doc["parent_id"] is None
    assert {"status", "error", "trigger", "steps", "criteria", "report", "duration_s"} <= set(doc)
    assert doc["steps"][0]["artifacts"][0]["size_bytes"] == 2**20
    assert _invoke(["history", recorded.run_id[:6], "--json"], recorded.url)[1] == shown
    code, listed, _ = _invoke(["history", "--json"], recorded.url)
    row = json.loads(listed)[0]
    assert row == {k: doc[k] for k in row}  # the list's rows: the view's keys and values


class _exit:
    """Catch the typer.Exit `_finish` ends with and keep its code (while capturing what it printed)."""

    code: int | None = None

    def __enter__(self) -> _exit:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        import typer

        if isinstance(exc, typer.Exit):
            self.code = exc.exit_code
            return True
        return False


def test_run_json_prints_the_view(recorded: Recorded, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from flows import cli as flows_cli

    monkeypatch.setenv("ALIGNFLOW_DB_URL", recorded.url)
    with _exit() as exited:
        flows_cli._finish({"run_id": recorded.run_id}, True, 0.0)
    assert exited.code == 1
    with Store.open(recorded.url) as store:
        assert json.loads(capsys.readouterr().out) == run_view(store, recorded.run_id).model_dump(mode="json")


def test_show_prints_status_steps_and_criteria_within_the_terminal(recorded: Recorded) -> None:
    for columns in (80, 120):
        code, out, _ = _invoke(["show", recorded.run_id], recorded.url, columns)
        assert code == 0
        assert all(len(line) <= columns for line in out.splitlines()), out
        lines = out.splitlines()
        assert lines[0] == f"run {recorded.run_id} of glm-mini: completed, verdict FAIL"
        assert "trigger cli" in lines[1]
        assert out.index("npu_base_train") < out.index("convert_bf16") < out.index("gpu_train") \
            < out.index("npu_reload_train") < out.index("compare")
        assert "FAIL" in out
        assert "0.5%" in out
    assert _invoke(["history", recorded.run_id], recorded.url)[1] == _invoke(["show", recorded.run_id],
                                                                              recorded.url)[1]


def test_a_failed_step_and_its_error_are_shown(tmp_path: Path) -> None:
    failed = record_run(tmp_path, fail_step="gpu_train")
    code, out, _ = _invoke(["show", failed.run_id], failed.url)
    assert code == 0
    assert "gpu_train: exited 1: out of memory" in out


def test_show_without_a_store_says_so_and_creates_none(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'none' / 'store.sqlite'}"
    code, _, err = _invoke(["show", "abcd"], url)
    assert code == 2  # a usage error: nothing was recorded where it looked
    assert "error: no store at" in err
    assert not (tmp_path / "none").exists()


def test_report_context_has_every_fingerprint_the_steps_and_both_sides_snapshots(recorded: Recorded) -> None:
    with Store.open(recorded.url) as store:
        ctx = report_context(run_view(store, recorded.run_id))
    names = [(f.name, f.step) for f in ctx.fingerprints]
    assert names == [("data", ""), ("base_ckpt", "npu_base_train"), ("bf16_ckpt", "convert_bf16"),
                     ("megatron_ckpt", "convert_megatron"), ("gpu_log", "gpu_train"), ("npu_log", "npu_reload_train")]
    assert ctx.fingerprints[0].sha256 == DATA_SHA
    assert [s.step for s in ctx.steps][-1] == "compare"
    assert {k: v["host"] for k, v in ctx.snapshots.items()} == {"NPU": "ascend", "GPU": "cuda"}
