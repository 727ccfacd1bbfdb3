"""The MindSpore twin against real MindFormers 2.1.0: the same log lines, checkpoint layout, `common.json`,
tensor names/dtypes/metadata and resume lines.

The real output is in tests/data/mindformers_2.1.0/, written by the MindFormers CPU lab (real MindFormers 2.1.0
PyNative trainer, tiny Qwen3 of the `qwen3` preset; `tests/lab/mindformers_fixtures.py` trims it and replaces the
run directory with /data/run01). Each twin line is rendered with the real line's own values and time and must
equal it byte for byte.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from alignflow.errors import SentinelError
from alignflow.logs import CHECKPOINT_LOADED, check_sentinels
from alignflow.logs.parse import parse_log
from alignflow.logs.render import mindformers_pynative_line
from alignflow.twin import logformats as fmt

REAL = Path(__file__).resolve().parents[1] / "data" / "mindformers_2.1.0"
LOGGER = "mindformers/data/run01/output/log"
_TS = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3}) ")


def _real(name: str, needle: str) -> str:
    lines = [line for line in (REAL / name).read_text().splitlines() if needle in line]
    assert lines, f"{name} has no line with {needle!r}"
    return lines[0]


def _twin_line(real_line: str, message: str, site: str, level: int = logging.INFO) -> str:
    """The twin's formatter applied to `message`, at the real line's time."""
    m = _TS.match(real_line)
    assert m is not None
    when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    record = logging.LogRecord("twin", level, __file__, 0, message, None, None)
    record.created, record.msecs = when.timestamp(), float(m.group(2))
    record.site = site
    return fmt.MindFormersFormatter(LOGGER).format(record)


def _loss_values(line: str) -> dict[str, str]:
    body = line.split("{ ", 1)[1].rstrip(" }")
    return dict(part.split(": ", 1) for part in body.split(", ")[1:])


@pytest.mark.parametrize("log", ["train.log", "resume.log", "reload.log"])
def test_step_lines_are_real_mindformers_lines(log: str) -> None:
    for real in [line for line in (REAL / log).read_text().splitlines() if "loss_callback.py:337" in line]:
        step, total = (int(x) for x in re.search(r"step:\[\s*(\d+)/\s*(\d+)\]", real).groups())  # type: ignore[union-attr]
        v = _loss_values(real)
        message = mindformers_pynative_line(
            step, total, consumed_samples=int(v["consumed_samples"]), global_batch_size=int(v["global_batch_size"]),
            loss=float(v["loss"]), step_time_ms=int(v["per_step_time"].rstrip("ms")), load_balancing_loss=None,
            mtp_losses=(), lr=float(v["lr"]), grad_norm=float(v["grad_norm"]),
            throughput_tflops=float(v["throughput"].rstrip("T")), prefix="none")
        assert _twin_line(real, message, "loss") == real


@pytest.mark.parametrize(("log", "needle", "site", "message"), [
    ("train.log", "Start training loop", "start", "Start training loop..."),
    ("reload.log", "All Network parameters are loaded.", "load", "All Network parameters are loaded."),
    ("reload.log", "All Checkpoint weights are loaded.", "load", "All Checkpoint weights are loaded."),
    ("missing_parameter.log", "Network parameters not loaded:", "load_detail", "Network parameters not loaded:"),
    ("missing_parameter.log", "  - output_layer.weight", "load_detail_name", "  - output_layer.weight"),
    ("resume.log", "Resume dataset", "resume",
     fmt.mindformers_resume_message(local_batch_size=2, consumed_samples=6, global_step=3)),
    ("train.log", "Checkpoint saved at step", "save", fmt.mindformers_saved_message(3, "/data/run01/ckpt")),
])
def test_other_lines_are_real_mindformers_lines(log: str, needle: str, site: str, message: str) -> None:
    real = _real(log, needle)
    assert _twin_line(real, message, site) == real


@pytest.mark.parametrize("log", ["train.log", "resume.log", "reload.log"])
def test_the_parser_reads_real_logs(log: str) -> None:
    parsed = parse_log((REAL / log).read_text().splitlines(), source=log)
    real_steps = [int(m) for m in re.findall(r"step:\[\s*(\d+)/", (REAL / log).read_text())]
    assert list(parsed.frame.index) == real_steps
    assert not parsed.fatal_sentinels


@pytest.mark.parametrize(("log", "says"), [("missing_checkpoint.log", "Skipping checkpoint loading"),
                                           ("missing_parameter.log", "output_layer.weight")])
def test_a_real_run_that_did_not_load_its_checkpoint_is_fatal_when_a_load_is_required(log: str, says: str) -> None:
    parsed = parse_log((REAL / log).read_text().splitlines(), source=log)
    with pytest.raises(SentinelError, match=says):
        check_sentinels(parsed, require=(CHECKPOINT_LOADED,))


def test_a_real_reload_reports_its_checkpoint_loaded() -> None:
    parsed = parse_log((REAL / "reload.log").read_text().splitlines(), source="reload.log")
    check_sentinels(parsed, require=(CHECKPOINT_LOADED,))


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(size))
    meta = header.pop("__metadata__", None)
    return {"metadata": meta, "tensors": {k: {"dtype": v["dtype"], "shape": v["shape"]}
                                          for k, v in sorted(header.items())}}


@pytest.fixture(scope="module")
def twin_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A twin checkpoint of the lab's model (qwen3 preset) at iteration 3, with optimizer, as the lab saved."""
    pytest.importorskip("mindspore")
    from alignflow.twin import ms_checkpoint as ckpt
    from alignflow.twin.mindspore_train import _model_state
    from alignflow.twin.ms_model import TwinGPTMindSpore
    from alignflow.twin.ms_optim import AdamW
    from alignflow.twin.presets import preset, twin_spec
    from alignflow.twin.schedule import LRSchedule, OptimSettings

    net = TwinGPTMindSpore(twin_spec(preset("qwen3")))
    settings = OptimSettings(schedule=LRSchedule(max_lr=1e-3, min_lr=0.0, warmup_steps=0, decay_steps=3,
                                                 style="constant"), weight_decay=0.0, beta1=0.9, beta2=0.95,
                             eps=1e-8, clip_grad=1.0, bf16_params=False)
    optimizer = AdamW(net.trainable_params(), settings)
    save_path = tmp_path_factory.mktemp("twin") / "ckpt"
    step = ckpt.global_step_tensor(3)
    ckpt.save(save_path, 3, prefix="checkpoint", model=_model_state(net, bf16=False),
              optimizer=[*optimizer.state(), step],
              common=ckpt.common_info(step_num=3, global_step=3, global_batch_size=2, consumed_samples=6),
              save_max=2, saved_by_this_run=[])
    return save_path


def test_checkpoint_layout_and_common_json_are_real(twin_checkpoint: Path) -> None:
    real = json.loads((REAL / "layout.json").read_text())
    assert (twin_checkpoint / "latest_checkpointed_iteration.txt").read_text() == real["tracker"]
    it_dir = twin_checkpoint / real["iteration_dir"]
    assert sorted(p.name for p in it_dir.iterdir()) == real["files"]
    assert (it_dir / "common.json").read_bytes() == (REAL / "common.json").read_bytes()


def test_tensor_names_dtypes_shapes_and_metadata_are_real(twin_checkpoint: Path) -> None:
    real = json.loads((REAL / "layout.json").read_text())
    it_dir = twin_checkpoint / real["iteration_dir"]
    for name, header in real["safetensors"].items():
        twin = _header(it_dir / name)
        assert twin["metadata"] == header["metadata"], name
        assert twin["tensors"] == header["tensors"], name
