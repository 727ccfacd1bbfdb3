"""`alignflow export RUN --tensorboard DIR --mlflow [--mlflow-uri URI]`, read back with the tools' own readers:
TensorBoard's event multiplexer and the data provider its scalars dashboard queries, and MLflow's client on a
SQLite tracking store (the local default under the state dir included)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.errors import AlignflowError
from tests.recorded_run import DATA_SHA, STEPS, Recorded, record_run

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return record_run(tmp_path_factory.mktemp("run"))


def _export(recorded: Recorded, *args: str, run_id: str | None = None,
            env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Invoke the command; an AlignflowError comes back as `alignflow.cli.main` would print it (code, message)."""
    result = runner.invoke(app, ["export", run_id or recorded.run_id[:6], *args],
                           env={"ALIGNFLOW_DB_URL": recorded.url, "MLFLOW_TRACKING_URI": "", **(env or {})})
    if isinstance(result.exception, AlignflowError):
        return result.exception.exit_code, result.stdout, str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_tensorboard_gets_one_run_per_side_so_its_scalars_view_overlays_them(recorded: Recorded,
                                                                            tmp_path: Path) -> None:
    from tensorboard import context
    from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    logdir = tmp_path / "tb"
    code, out, err = _export(recorded, "--tensorboard", str(logdir))
    assert code == 0, err
    # what `tensorboard --logdir DIR` does: every directory holding event files is a run
    multiplexer = EventMultiplexer(tensor_size_guidance={"scalars": 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = MultiplexerDataProvider(multiplexer, str(logdir))
    ctx = context.RequestContext()
    listed = provider.list_scalars(ctx, experiment_id="", plugin_name="scalars")
    npu, gpu, error = (f"{recorded.run_id}/{side}" for side in ("NPU", "GPU", "error"))
    assert sorted(listed) == sorted([npu, gpu, error])
    # the scalars dashboard draws one chart per tag with every run that has it: both sides in each chart
    for metric in ("lm_loss", "grad_norm", "mtp_1_loss", "lr"):
        assert metric in listed[npu]
        assert metric in listed[gpu]
    assert set(listed[error]) >= {"error/lm_loss", "error/grad_norm"}
    assert not set(listed[error]) & set(listed[npu])  # the error (~1e-3) never shares a chart with a loss (~5)
    data = provider.read_scalars(ctx, experiment_id="", plugin_name="scalars", downsample=STEPS * 2,
                                 run_tag_filter=None)
    points = data[npu]["lm_loss"]
    assert [p.step for p in points] == list(range(1, STEPS + 1))
    expected = recorded.npu.frame["lm_loss"].to_numpy()
    assert np.allclose([p.value for p in points], expected, rtol=1e-7)  # TensorBoard keeps scalars as float32
    gpu_values = recorded.gpu.frame["lm_loss"].to_numpy()
    assert np.allclose([p.value for p in data[error]["error/lm_loss"]], expected - gpu_values, atol=1e-6)
    assert f"tensorboard: {logdir / recorded.run_id} (runs GPU, NPU, error; open with: tensorboard --logdir " \
           f"{logdir})" in out
    again = _export(recorded, "--tensorboard", str(logdir))
    assert again[0] == 1
    assert "was already exported there" in again[2]


@pytest.mark.slow  # MLflow creates its SQLite schema with Alembic migrations (~15 s on the shared machine)
def test_mlflow_gets_a_parent_run_with_parameters_criteria_and_report_and_a_child_per_side(recorded: Recorded,
                                                                                         tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'deep' / 'mlflow.db'}"  # its directory is created
    code, out, err = _export(recorded, "--mlflow", "--mlflow-uri", uri)
    assert code == 0, err
    assert f"; open with: mlflow ui --backend-store-uri {uri}" in out
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("glm-mini")
    assert experiment is not None
    assert experiment.artifact_location == (tmp_path / "deep" / "artifacts").as_uri()  # beside the store, not ./mlruns
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`alignflow.run_id` = '{recorded.run_id}'")
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = {r.data.tags["alignflow.side"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert len(runs) == 3
    assert sorted(children) == ["GPU", "NPU"]
    assert {r.data.tags["mlflow.parentRunId"] for r in children.values()} == {parent.info.run_id}
    assert parent.info.run_name == recorded.run_id
    assert children["NPU"].info.run_name == f"{recorded.run_id} NPU"
    # parameters: training, model, data fingerprint, criteria, artifacts' sha256
    p = parent.data.params
    assert (p["training.lr"], p["training.global_batch_size"], p["training.steps"]) == ("0.001", "8", str(STEPS))
    assert (p["model.hidden_size"], p["model.moe.num_experts"], p["conversion.spec"]) == ("128", "4", "glm-mini")
    assert p["data.sha256"] == DATA_SHA
    assert p["criterion.0"] == "|me(lm_loss)| < 0.001"
    assert p["sha256.convert_bf16.bf16_ckpt"] == "f" * 64
    # criteria as metrics, not string tags
    m = parent.data.metrics
    assert m["criterion_passed/me lm_loss"] == 0.0
    assert m["criterion/me lm_loss"] == pytest.approx(0.003, abs=2e-4)
    assert m["criterion_passed/step_rel lm_loss step 1"] in (0.0, 1.0)
    assert parent.data.tags["alignflow.verdict"] == "fail"
    errors = client.get_metric_history(parent.info.run_id, "error/lm_loss")
    assert len(errors) == STEPS
    # the report as artifacts
    listed = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.html", "report/aligned.csv", "report/summary.md", "report/comparison.json"} <= listed
    local = Path(client.download_artifacts(parent.info.run_id, "report/aligned.csv", str(tmp_path / "dl")))
    assert local.read_text().startswith("step,")
    # each side: its per-step metrics and the host it trained on
    npu = children["NPU"]
    assert npu.data.params["npu.kind"] == "mindformers"
    assert npu.data.params["package.mindspore"] == "2.10.0"
    assert npu.data.params["device"] == "CPU (no npu-smi, no nvidia-smi on the host)"
    assert children["GPU"].data.params["package.torch"] == "2.6.0"
    history = client.get_metric_history(npu.info.run_id, "lm_loss")
    assert [h.step for h in sorted(history, key=lambda h: h.step)] == list(range(1, STEPS + 1))
    values = {h.step: h.value for h in history}
    assert all(math.isclose(values[s], v) for s, v in recorded.npu.frame["lm_loss"].items())
    assert len(client.get_metric_history(children["GPU"].info.run_id, "grad_norm")) == STEPS
    again = _export(recorded, "--mlflow", "--mlflow-uri", uri)
    assert again[0] == 1
    assert f"run {recorded.run_id} was already exported to experiment 'glm-mini'" in again[2]
    assert len(client.search_runs([experiment.experiment_id])) == 3


# What MLflow reads as "this is CI or a test" (and then keeps its telemetry off by itself): left out of the
# command's environment, so that what the test sees is what a user's shell gets.
MLFLOW_CI_MARKERS = ("PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "CI", "CIRCLECI", "GITLAB_CI", "JENKINS_URL", "TRAVIS",
                     "TF_BUILD", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE", "TEAMCITY_VERSION",
                     "CLOUD_RUN_EXECUTION", "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME", "RUNBOT_WORKER_ID",
                     "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "MLFLOW_TRACKING_URI", "XDG_CONFIG_HOME")


@pytest.mark.slow  # MLflow's schema again
def test_mlflow_without_a_uri_tracks_into_the_state_dir_and_nothing_outside_it(
        recorded: Recorded, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """`alignflow export RUN --mlflow` as a user types it: the state dir's SQLite store, its artifacts beside it,
    and nothing in the home directory (MLflow's telemetry would write ~/.config/mlflow and post usage records)."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    state, home = tmp_path / "state", tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in subprocess_env.items() if k not in MLFLOW_CI_MARKERS}
    env.update(ALIGNFLOW_DB_URL=recorded.url, ALIGNFLOW_STATE_DIR=str(state), HOME=str(home))
    done = subprocess.run([sys.executable, "-m", "alignflow", "export", recorded.run_id, "--mlflow"], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    uri = f"sqlite:///{state / 'mlflow' / 'mlflow.db'}"
    assert done.stdout.startswith(f"mlflow: {uri}: run ")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("glm-mini")
    assert experiment is not None
    assert len(client.search_runs([experiment.experiment_id])) == 3
    assert (state / "mlflow" / "artifacts").is_dir()
    assert sorted(p.name for p in home.rglob("*")) == []


def test_a_file_store_uri_is_refused_before_anything_is_written(recorded: Recorded, tmp_path: Path) -> None:
    code, _, err = _export(recorded, "--mlflow-uri", f"file://{tmp_path / 'mlruns'}")
    assert code == 2
    assert "MLflow 3 keeps no file stores; give a database URI (sqlite:///PATH/mlflow.db)" in err
    assert not (tmp_path / "mlruns").exists()


def test_export_needs_a_target_and_a_recorded_run(recorded: Recorded, tmp_path: Path) -> None:
    code, _, err = _export(recorded)
    assert code == 2
    assert "name a target: --tensorboard DIR and/or --mlflow [--mlflow-uri URI]" in err
    code, _, err = _export(recorded, "--tensorboard", str(tmp_path), run_id="ffffffff")
    assert code == 2  # an id that names no run is a usage error
    assert "run 'ffffffff': no such id" in err
