"""Fast tests of diagnose's parts: injection switches, dump budget, msprobe's accuracy rule, the spec mapping
applied to dumps, the HTML section, 'Nx noise' criteria and the noise floor in the store. No training runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from alignflow.config.criteria import Criterion
from alignflow.config.experiment import Experiment
from alignflow.convert.ops import DeinterleaveRows, InterleaveRows
from alignflow.convert.plan import build_plan
from alignflow.convert.registry import load_spec
from alignflow.diagnose.compare import diagnose_dumps
from alignflow.diagnose.mapping import ParamMap, mapping_from_params, mapping_from_plan
from alignflow.diagnose.metrics import Tolerance, compare_tensors, msprobe_accuracy
from alignflow.diagnose.noise import NoiseFloor, latest_noise_floor, noise_floor, record_noise, resolve_criteria
from alignflow.diagnose.report import html_section
from alignflow.errors import ConfigError
from alignflow.frameworks.dumpfile import DumpBudgetExceeded, DumpRequest, DumpWriter, read_dump
from alignflow.logs import parse_log
from alignflow.logs.render import megatron_line
from alignflow.twin.faults import parse_faults
from alignflow.twin.presets import preset, twin_spec
from alignflow.twin.schedule import LRSchedule, OptimSettings


def test_injection_switches_change_only_what_they_name() -> None:
    f = parse_faults("activation=gelu, rotary_base=1e6,norm_topk_prob=false,adam_eps=1e-6,bf16_writeback=true")
    spec = f.model(twin_spec(preset("twin-moe")))
    assert (spec.activation, spec.rotary_base) == ("gelu", 1e6)
    assert spec.moe is not None
    assert spec.moe.norm_topk_prob is False
    base = OptimSettings(LRSchedule(1e-3, 0.0, 0, 10, "constant"), 0.0, 0.9, 0.95, 1e-8, 1.0, False)
    assert (f.optimizer(base).eps, f.optimizer(base).bf16_params) == (1e-6, True)
    assert parse_faults("").model(twin_spec(preset("twin-moe"))) == twin_spec(preset("twin-moe"))


@pytest.mark.parametrize("text", ["activation=relu", "learning_rate=1", "adam_eps=-1", "norm_topk_prob=maybe", "gelu"])
def test_a_bad_injection_switch_is_a_config_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError, match="ALIGNFLOW_TWIN_INJECT"):
        parse_faults(text)


def test_a_dump_past_its_budget_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    writer = DumpWriter(DumpRequest(str(tmp_path / "dump"), budget_bytes=1000, side="gpu"), framework="pytorch")
    writer.tensor("a", np.zeros(200, np.float32))  # 800 bytes
    with pytest.raises(DumpBudgetExceeded, match=r"dump budget of 1e-06 GB \(1000 bytes\)"):
        writer.tensor("b", np.zeros(100, np.float32))
    assert not (tmp_path / "dump").exists()
    assert list(tmp_path.iterdir()) == []


def test_run_diagnosis_refuses_a_model_larger_than_the_budget_before_launching(tmp_path: Path) -> None:
    from alignflow.diagnose.core import Checkpoints, DataRef, run_diagnosis

    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the transport was used ({name}) although the dump was refused")

    exp = _experiment(tmp_path)
    with pytest.raises(DumpBudgetExceeded, match=r"dump budget of 0\.001 GB \(1000000 bytes\); nothing was launched"):
        run_diagnosis(exp, checkpoints=Checkpoints("a", "b"), data=DataRef("d", "d", "0" * 64),
                      transport=Untouchable(), out_dir=tmp_path / "out", budget_bytes=1_000_000)  # type: ignore[arg-type]


def test_msprobe_accuracy_rule_and_the_amplification_warning() -> None:
    assert msprobe_accuracy(0.98, 0.002) == "No"
    assert msprobe_accuracy(0.98, 0.0005) == "Yes"  # both conditions must fail
    assert msprobe_accuracy(0.85, 0.0) == "No"
    ref = np.linspace(-1, 1, 1000)
    small = ref + 1e-3 * np.sin(np.arange(1000))
    assert compare_tensors(small, ref, Tolerance(), input_rel=1e-7).status == "diverged"  # 10x the input's error
    assert compare_tensors(small, ref, Tolerance(), input_rel=1e-2).status != "diverged"  # the input explains it
    assert compare_tensors(np.zeros(3), np.zeros(3), Tolerance()).status == "match"


def test_module_renames_come_from_the_spec() -> None:
    spec = load_spec("twin-moe")
    new = mapping_from_plan(build_plan(spec, flavor="local", megatron_version="0.17"))
    assert new.renames == (("mtp.layers.0.transformer_layer", "mtp.layers.0.mtp_model_layer"),)
    assert new.gpu_module("mtp.layers.0.transformer_layer.mlp.router") == "mtp.layers.0.mtp_model_layer.mlp.router"
    assert new.gpu_module("decoder.layers.1.mlp") == "decoder.layers.1.mlp"  # expert_bias moves, the MLP does not


def _write(path: Path, framework: str, weight: np.ndarray, output: np.ndarray, x: np.ndarray) -> Path:
    w = DumpWriter(DumpRequest(str(path), side=framework), framework=framework)
    call = w.begin_call("mlp.linear_fc1", "Linear", None)
    call.inputs = [w.tensor("in", x)]
    call.outputs = [w.tensor("out", output)]
    w.param("mlp.linear_fc1.weight", "loaded", weight, trainable=True)
    w.param("mlp.linear_fc1.weight", "grad", weight * 0.1, trainable=True)
    w.param("mlp.linear_fc1.weight", "updated", weight * 0.99, trainable=True)
    return w.write()


FC1 = mapping_from_params("t", [ParamMap("spec.yaml:1", ("mlp.linear_fc1.weight",), ("mlp.linear_fc1.weight",),
                                         (DeinterleaveRows(0),))])


@pytest.mark.parametrize("gpu_bug", [False, True])
def test_dumps_are_compared_through_the_spec_ops_weights_and_activations(tmp_path: Path, gpu_bug: bool) -> None:
    rng = np.random.default_rng(0)
    mf_weight = rng.standard_normal((8, 4)).astype(np.float32)  # rows [g0, u0, g1, u1, ...]
    (mg_weight,) = DeinterleaveRows(0).apply([__import__("torch").from_numpy(mf_weight)])
    mg_weight = mg_weight.numpy()
    if gpu_bug:  # the converter copied the rows without de-interleaving them
        (bad,) = InterleaveRows(0).apply([__import__("torch").from_numpy(mg_weight)])
        mg_weight = bad.numpy()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    npu = read_dump(_write(tmp_path / "npu", "mindspore", mf_weight, x @ mf_weight.T, x))
    gpu = read_dump(_write(tmp_path / "gpu", "pytorch", mg_weight, x @ mg_weight.T, x))
    d = diagnose_dumps(npu, gpu, FC1)
    if not gpu_bug:
        assert d.verdict == "pass", d.cause
        assert d.rows[0].output is not None
        assert d.rows[0].output.status == "match"  # interleaved NPU features compared with [gate; up]
        assert 'id="af-first-divergence"' not in html_section(d)
    else:
        assert d.cause is not None
        assert (d.cause.kind, d.cause.module) == ("conversion", "mlp.linear_fc1")
        assert 'class="first" id="af-first-divergence"' in html_section(d)
        assert d.to_json()["first_divergent_row"] == 0


def _swiglu_dump(path: Path, framework: str, fc1: np.ndarray, fc2: np.ndarray, x: np.ndarray, split: str,
                 act: str = "silu") -> Path:
    """A SwiGLU MLP's step: `mlp` with its `linear_fc1` and `linear_fc2` calls, the activation reading fc1's output
    rows interleaved (`pairs`, MindFormers) or as `[gate; up]` (`halves`, Megatron)."""
    h = x @ fc1.T
    gate, up = (h[:, 0::2], h[:, 1::2]) if split == "pairs" else np.split(h, 2, axis=-1)
    a = gate / (1 + np.exp(-gate)) if act == "silu" else 0.5 * gate * (1 + np.tanh(0.79788456 * gate))
    mid = a * up
    out = mid @ fc2.T
    w = DumpWriter(DumpRequest(str(path), side=framework), framework=framework)
    mlp = w.begin_call("mlp", "MLP", None)
    mlp.inputs, mlp.outputs = [w.tensor("mlp.in", x)], [w.tensor("mlp.out", out)]
    c1 = w.begin_call("mlp.linear_fc1", "Linear", mlp.id)
    c1.inputs, c1.outputs = [w.tensor("fc1.in", x)], [w.tensor("fc1.out", h)]
    c2 = w.begin_call("mlp.linear_fc2", "Linear", mlp.id)
    c2.inputs, c2.outputs = [w.tensor("fc2.in", mid)], [w.tensor("fc2.out", out)]
    for name, weight in (("mlp.linear_fc1.weight", fc1), ("mlp.linear_fc2.weight", fc2)):
        w.param(name, "loaded", weight, trainable=True)
        w.param(name, "grad", weight * 0.1, trainable=True)
        w.param(name, "updated", weight * 0.99, trainable=True)
    return w.write()


@pytest.mark.parametrize("case", ["spec_right", "spec_without_deinterleave", "gelu_on_npu"])
def test_a_swiglu_layout_bug_the_spec_hides_is_named_a_conversion_of_fc1(tmp_path: Path, case: str) -> None:
    # docs/seeds.md#moe-shared-expert-fc1-not-de-interleaved, with the broken spec also used for the diagnosis: the
    # weights agree through it after load, and the first divergence is the fc2 input of the MLP
    rng = np.random.default_rng(1)
    mf_fc1 = rng.standard_normal((8, 6)).astype(np.float32)  # rows [g0, u0, g1, u1, ...]
    fc2 = rng.standard_normal((6, 4)).astype(np.float32)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    ops = () if case == "spec_without_deinterleave" else (DeinterleaveRows(0),)
    mapping = mapping_from_params("spec.yaml", [
        ParamMap("spec.yaml:7", ("mlp.linear_fc1.weight",), ("mlp.linear_fc1.weight",), ops),
        ParamMap("spec.yaml:9", ("mlp.linear_fc2.weight",), ("mlp.linear_fc2.weight",), ())])
    (mg_fc1,) = ParamMap("", ("w",), ("w",), ops).apply([mf_fc1])  # what the converter with this spec wrote
    npu = read_dump(_swiglu_dump(tmp_path / "npu", "mindspore", mf_fc1, fc2, x, "pairs",
                                 "gelu" if case == "gelu_on_npu" else "silu"))
    gpu = read_dump(_swiglu_dump(tmp_path / "gpu", "pytorch", mg_fc1.astype(np.float32), fc2, x, "halves"))
    d = diagnose_dumps(npu, gpu, mapping)
    found = (d.cause.kind, d.cause.module) if d.cause else None
    assert found == {"spec_right": None, "spec_without_deinterleave": ("conversion", "mlp.linear_fc1"),
                     "gelu_on_npu": ("forward", "mlp")}[case], d.cause
    if case == "spec_without_deinterleave":
        assert d.cause is not None
        assert "interleaved [g0, u0, g1, u1, ...] (NPU) and [gate; up] (GPU)" in " ".join(d.cause.details)
        assert "the rule spec.yaml:7 (rename) must turn" in " ".join(d.cause.details)


def test_nx_noise_thresholds_resolve_from_the_floor_and_fail_unmeasured() -> None:
    c = Criterion(metric="lm_loss", statistic="me", threshold="3x noise")
    assert math.isnan(c.threshold)
    assert "noise not measured" in c.label
    floor = NoiseFloor("e", 3, {"lm_loss": {"me": 2e-4}}, {"lm_loss": {1: 2e-4}}, {"lm_loss": 1e-6})
    (resolved,) = resolve_criteria([c], floor)
    assert resolved.threshold == pytest.approx(6e-4)
    (unresolved,) = resolve_criteria([Criterion(metric="grad_norm", statistic="me", threshold="2x noise")], floor)
    assert math.isnan(unresolved.threshold)
    with pytest.raises(ValueError, match="threshold"):
        Criterion(metric="lm_loss", statistic="me", threshold=0)


def _experiment(tmp_path: Path, **extra: Any) -> Experiment:
    return Experiment.model_validate({
        "name": "noise-test", "data": {"path": str(tmp_path / "d"), "prefix": "d"},
        "model": preset("twin-moe").model_dump(mode="json"),
        "training": {"seed": 1, "steps": 3, "lr": 1e-3, "micro_batch_size": 4, "global_batch_size": 4},
        "conversion": {"spec": "twin-moe"}, **extra})


def test_experiment_criteria_section_carries_noise_runs(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, criteria={"noise_runs": 4, "rules": [
        {"metric": "lm_loss", "statistic": "me", "threshold": "3x noise"}]})
    assert exp.noise_runs == 4
    assert exp.criteria[0].noise_multiple == 3
    assert Experiment.model_validate(exp.model_dump(mode="json")).criteria == exp.criteria
    with pytest.raises(ValueError, match="unknown key"):
        _experiment(tmp_path, criteria={"noise": 3})


def _log(losses: list[float]) -> Any:
    lines = [megatron_line(i + 1, len(losses), consumed_samples=4 * (i + 1), elapsed_ms=10.0, lr=1e-3,
                           global_batch_size=4, losses={"lm loss": v}, grad_norm=1.0) for i, v in enumerate(losses)]
    return parse_log(lines, fmt="megatron", first_interval="raw")


def test_the_noise_floor_is_recorded_and_read_back_from_the_store(tmp_path: Path) -> None:
    from alignflow.store import Store

    logs = [_log([5.0, 4.9, 4.8]), _log([5.0, 4.9003, 4.8]), _log([5.0, 4.8995, 4.8001])]
    floor = noise_floor("noise-test", logs)
    assert floor.statistics["lm_loss"]["max_abs"] == pytest.approx(5e-4, rel=1e-3)
    assert floor.band["lm_loss"] == pytest.approx({1: 0.0, 2: 5e-4, 3: 1e-4}, rel=1e-3, abs=1e-12)
    with Store.open(f"sqlite:///{tmp_path / 's.sqlite'}") as store:
        recorded = record_noise(store, _experiment(tmp_path), floor, logs)
        back = latest_noise_floor(store, "noise-test")
        assert back is not None
        assert back.run_id == recorded.run_id
        assert back.statistics == floor.statistics
        band = store.metrics(str(recorded.run_id), "noise_band", wide=True)
        assert band["lm_loss"].tolist() == pytest.approx([0.0, 5e-4, 1e-4], rel=1e-3, abs=1e-12)


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "alignflow", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.integration
def test_cli_diagnose_setup_writes_msprobe_files(tmp_path: Path, subprocess_env: dict[str, str],
                                                 repo_root: Path) -> None:
    import json

    done = _cli(["diagnose-setup", str(repo_root / "experiments" / "demo.yaml"), "--dump-path", "/data/dump",
                 "--step", "2", "--out", str(tmp_path / "setup")], subprocess_env, tmp_path)
    assert done.returncode == 0, done.stderr
    cfg = json.loads((tmp_path / "setup" / "config.json").read_text())
    assert cfg["step"] == [1, 2]
    assert "debugger.start(model=model)" in (tmp_path / "setup" / "gpu_megatron.txt").read_text()
    assert (tmp_path / "setup" / "layer_mapping.yaml").read_text().strip() == "{}"  # mcore 0.16: no rename


@pytest.mark.integration
def test_cli_diagnose_of_an_unknown_run_is_bad_input_not_a_traceback(tmp_path: Path,
                                                                       subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "ALIGNFLOW_STATE_DIR": str(tmp_path / "state")}
    done = _cli(["diagnose", "abcdef"], env, tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "abcdef" in done.stderr
