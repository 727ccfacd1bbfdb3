"""`alignflow export RUN --tensorboard DIR --mlflow URI`, read back with TensorBoard's own event reader and
MLflow's own client on a local SQLite tracking store."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.errors import AlignflowError
from tests.recorded_run import STEPS, Recorded, record_run

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return record_run(tmp_path_factory.mktemp("run"))


def _export(recorded: Recorded, *args: str, run_id: str | None = None) -> tuple[int, str, str]:
    """Invoke the command; an AlignflowError comes back as `alignflow.cli.main` would print it (code, message)."""
    result = runner.invoke(app, ["export", run_id or recorded.run_id[:6], *args],
                           env={"ALIGNFLOW_DB_URL": recorded.url})
    if isinstance(result.exception, AlignflowError):
        return result.exception.exit_code, result.stdout, str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_tensorboard_gets_both_sides_and_the_error_under_one_run(recorded: Recorded, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.util import tensor_util

    code, out, err = _export(recorded, "--tensorboard", str(tmp_path / "tb"))
    assert code == 0, err
    run_dir = tmp_path / "tb" / recorded.run_id
    assert f"tensorboard: {run_dir}" in out
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    assert {"lm_loss/NPU", "lm_loss/GPU", "lm_loss/error", "grad_norm/NPU", "grad_norm/GPU"} <= tags

    def series(tag: str) -> tuple[list[int], list[float]]:
        events = acc.Tensors(tag)
        return [e.step for e in events], [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events]

    steps, npu = series("lm_loss/NPU")
    assert steps == list(range(1, STEPS + 1))
    expected = recorded.npu.frame["lm_loss"].to_numpy()
    assert np.allclose(npu, expected, rtol=1e-7)  # TensorBoard keeps scalars as float32
    _, error = series("lm_loss/error")
    gpu = recorded.gpu.frame["lm_loss"].to_numpy()
    assert np.allclose(error, expected - gpu, atol=1e-6)
    layout = layout_pb2.Layout()
    config = acc.Tensors("custom_scalars__config__")[0].tensor_proto
    layout.ParseFromString(config.string_val[0])
    chart = next(c for c in layout.category[0].chart if c.title == "lm_loss")
    assert list(chart.multiline.tag) == [r"^lm_loss/(NPU|GPU)$"]
    again = _export(recorded, "--tensorboard", str(tmp_path / "tb"))
    assert again[0] == 1
    assert "was already exported there" in again[2]


@pytest.mark.slow  # MLflow creates its SQLite schema with Alembic migrations (~15 s on the shared machine)
def test_mlflow_gets_one_run_per_side_with_criteria_fingerprints_and_metrics(recorded: Recorded,
                                                                              tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code, _out, err = _export(recorded, "--mlflow", uri)
    assert code == 0, err
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("glm-mini")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`alignflow.run_id` = '{recorded.run_id}'")
    by_side = {r.data.tags["alignflow.side"]: r for r in runs}
    assert sorted(by_side) == ["GPU", "NPU"]
    npu = by_side["NPU"]
    assert npu.info.run_name == f"{recorded.run_id} NPU"
    assert npu.data.tags["alignflow.verdict"] == "fail"
    assert npu.data.params["criterion.0"] == "|me(lm_loss)| < 0.001"
    assert npu.data.params["criterion.2"] == "|step_rel(lm_loss, step 1)| < 0.5%"
    assert npu.data.tags["criterion.0.result"] == "FAIL"
    assert npu.data.tags["criterion.0.first_outside"] == "1"
    assert npu.data.params["sha256.input.data"] == "d" * 64
    assert npu.data.params["sha256.convert_bf16.bf16_ckpt"] == "f" * 64
    history = client.get_metric_history(npu.info.run_id, "lm_loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, STEPS + 1))
    values = {m.step: m.value for m in history}
    assert all(math.isclose(values[s], v) for s, v in recorded.npu.frame["lm_loss"].items())
    gpu_history = client.get_metric_history(by_side["GPU"].info.run_id, "grad_norm")
    assert len(gpu_history) == STEPS
    again = _export(recorded, "--mlflow", uri)
    assert again[0] == 1
    assert f"run {recorded.run_id} was already exported to experiment 'glm-mini'" in again[2]
    assert len(client.search_runs([experiment.experiment_id])) == 2


def test_export_needs_a_target_and_a_recorded_run(recorded: Recorded, tmp_path: Path) -> None:
    code, _, err = _export(recorded)
    assert code == 2
    assert "name a target: --tensorboard DIR and/or --mlflow URI" in err
    code, _, err = _export(recorded, "--tensorboard", str(tmp_path), run_id="ffffffff")
    assert code == 2  # an id that names no run is a usage error
    assert "run 'ffffffff': no such id" in err
