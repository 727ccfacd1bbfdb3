"""msprobe 26.2 dumps read by diagnose, and the mapping files it writes accepted by `msprobe compare`.

The dumps are real: `msprobe_scripts/dump_tiny.py` runs msprobe's own PyTorch and MindSpore `PrecisionDebugger`
(L0) over one step of the same tiny network on this CPU. One part of msprobe cannot run on a CPU: its MindSpore
statistics call `mint.norm`, whose LinalgVectorNorm kernel MindSpore 2.10 has only for Ascend/GPU; the script
stands a CPU L2 norm in for it and msprobe writes everything else itself.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.diagnose.compare import diagnose_dumps
from alignflow.diagnose.mapping import ParamMap, mapping_from_params
from alignflow.diagnose.msprobe import layer_mapping, msprobe_config, read_msprobe_dump, write_mapping_files

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent / "msprobe_scripts" / "dump_tiny.py"
MAPPING = mapping_from_params("tiny", [
    ParamMap("r1", ("block.transformer_layer.weight",), ("block.mtp_model_layer.weight",), ()),
    ParamMap("r2", ("block.proj.weight",), ("block.proj.weight",), ()),
])


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("msprobe")
    out = {}
    for name, args in {"pt": ["pytorch", "tensor"], "ms": ["mindspore", "tensor"], "ms_bad": ["mindspore", "tensor",
                       "perturb"], "pt_stats": ["pytorch", "statistics"]}.items():
        path = root / name
        argv = [sys.executable, str(SCRIPT), args[0], args[1], str(path), *args[2:]]
        done = subprocess.run(argv, cwd=root, env=subprocess_env, capture_output=True, text=True, timeout=600,
                              check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        out[name] = path / "step0"
    return out


def test_real_msprobe_dumps_are_read_with_calls_parameters_and_gradients(dumps: dict[str, Path]) -> None:
    pt = read_msprobe_dump(dumps["pt"], side="gpu")
    ms = read_msprobe_dump(dumps["ms"], side="npu")
    assert [c.module for c in pt.calls] == ["block", "block.mtp_model_layer", "block.proj"]
    assert [c.module for c in ms.calls] == ["block", "block.transformer_layer", "block.proj"]
    assert ms.calls[1].parent == ms.calls[0].id
    assert ms.calls[1].type == "Dense"
    assert {"block.proj.weight", "block.transformer_layer.weight"} <= set(ms.params)
    assert ms.params["block.proj.weight"].grad is not None
    assert pt.params["block.proj.weight"].grad is not None
    with ms.reader() as r:
        assert r.get(ms.calls[1].outputs[0]).shape == (2, 8)


def test_diagnose_maps_msprobe_names_through_the_spec_and_finds_a_changed_weight(dumps: dict[str, Path]) -> None:
    pt = read_msprobe_dump(dumps["pt"], side="gpu")
    clean = diagnose_dumps(read_msprobe_dump(dumps["ms"], side="npu"), pt, MAPPING)
    assert clean.verdict == "pass", clean.cause
    inner = next(r for r in clean.rows if r.module == "block.mtp_model_layer")
    assert inner.npu_module == "block.transformer_layer"
    assert inner.output is not None
    assert inner.output.compared
    bad = diagnose_dumps(read_msprobe_dump(dumps["ms_bad"], side="npu"), pt, MAPPING)
    assert bad.cause is not None
    assert (bad.cause.kind, bad.cause.module) == ("conversion", "block.proj")


def test_statistics_dumps_compare_by_their_norms(dumps: dict[str, Path]) -> None:
    stats = read_msprobe_dump(dumps["pt_stats"], side="gpu")
    assert not stats.files
    assert stats.stats
    d = diagnose_dumps(stats, read_msprobe_dump(dumps["pt"], side="gpu"), mapping_from_params("same", [
        ParamMap("r", ("block.mtp_model_layer.weight",), ("block.mtp_model_layer.weight",), ()),
        ParamMap("r", ("block.proj.weight",), ("block.proj.weight",), ())]))
    out = next(r for r in d.rows if r.module == "block.proj").output
    assert out is not None
    assert out.status == "match"
    assert "statistics" in out.note


def test_generated_mapping_files_make_msprobe_compare_match_renamed_modules(dumps: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    ms, pt = read_msprobe_dump(dumps["ms"], side="npu"), read_msprobe_dump(dumps["pt"], side="gpu")
    assert layer_mapping(MAPPING, ms) == {"Block": {"transformer_layer": "mtp_model_layer"}}
    files = write_mapping_files(tmp_path / "maps", MAPPING, ms, pt)
    for flag, key in (("-lm", "layer_mapping"), ("-dm", "data_mapping")):
        out = tmp_path / key
        argv = [str(Path(sys.executable).with_name("msprobe")), "compare", "-m", "auto", "-tp",
                str(next(dumps["ms"].rglob("dump.json"))), "-gp", str(next(dumps["pt"].rglob("dump.json"))),
                "-o", str(out), flag, str(files[key])]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with next(out.glob("compare_result_*.csv")).open() as f:
            rows = {r["NPU Name"]: r for r in csv.DictReader(f)}
        row = rows["Cell.block.transformer_layer.Dense.forward.0.output.0"]
        assert row["Bench Name"] == "Module.block.mtp_model_layer.Linear.forward.0.output.0", key
        assert float(row["Cosine"]) > 0.9999, key


def test_msprobe_config_dumps_the_step_and_the_next_one() -> None:
    cfg = msprobe_config("/dump", step=3)
    assert cfg["step"] == [2, 3]
    assert cfg["level"] == "L0"
    assert cfg["task"] == "tensor"
