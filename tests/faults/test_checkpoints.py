"""Issue 16, items 8 and 9, and the conversion cases that held: hostile checkpoints end in exit 1 with the file,
the tensor and the reason - no traceback, nothing written.

- Item 8: an fp16 or int32 tensor in a bf16 checkpoint used to convert (rc 0) into a mixed-dtype Megatron
  checkpoint.
- Item 9: a truncated file, offsets past the end of the file, or two tensors sharing bytes used to end in a
  raw `SafetensorError` traceback.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from alignflow.cli import app
from tests.convert.synthetic import source_state, write_mindformers
from tests.faults.conftest import staging_leftovers

pytestmark = pytest.mark.integration

runner = CliRunner()
SPEC = "twin-dense"
LAYER_KEY = "decoder.layers.0.self_attention.linear_proj.weight"


def _convert(kind: str, src: Path, dst: Path) -> Any:
    args = ["convert", kind, str(src), str(dst)] + (["--spec", SPEC] if kind == "megatron" else [])
    return runner.invoke(app, args)


def _refused(result: Any, *fragments: str) -> None:
    """Exit 1 through alignflow's own error (never an exception escaping the command), naming each fragment."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.output
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def _model_file(ckpt: Path) -> Path:
    (file,) = ckpt.glob("iteration_*/*-model-*.safetensors")
    return file


def _rewrite_header(file: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def _past_eof(header: dict[str, Any]) -> None:
    start, end = header[LAYER_KEY]["data_offsets"]
    header[LAYER_KEY]["data_offsets"] = [start + (1 << 30), end + (1 << 30)]


def _shared_bytes(header: dict[str, Any]) -> None:
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    same = [k for k in names if header[k]["shape"] == header[LAYER_KEY]["shape"] and k != LAYER_KEY]
    header[same[0]]["data_offsets"] = list(header[LAYER_KEY]["data_offsets"])


BROKEN: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "truncated": (lambda f: f.write_bytes(f.read_bytes()[:-100]), ("run past the end of the file",)),
    "header-past-eof": (lambda f: f.write_bytes(f.read_bytes()[:64]), ("truncated: the header is",)),
    "offsets-past-eof": (lambda f: _rewrite_header(f, _past_eof), (LAYER_KEY, "data_offsets")),
    "overlapping": (lambda f: _rewrite_header(f, _shared_bytes), ("overlapping tensors",)),
}


@pytest.mark.parametrize("kind", ["bf16", "megatron"])
@pytest.mark.parametrize("damage", list(BROKEN))
def test_an_unreadable_safetensors_file_is_exit_1_naming_file_tensor_and_reason(tmp_path: Path, kind: str,
                                                                               damage: str) -> None:
    src = write_mindformers(tmp_path / "src", source_state(SPEC))
    file = _model_file(src)
    breaker, fragments = BROKEN[damage]
    breaker(file)
    result = _convert(kind, src, tmp_path / "out")
    _refused(result, str(file), *fragments)
    assert not (tmp_path / "out").exists()
    assert staging_leftovers(tmp_path) == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.int32, torch.float32], ids=["fp16", "int32", "fp32"])
def test_a_tensor_of_the_wrong_dtype_in_a_bf16_checkpoint_is_refused_by_name(tmp_path: Path,
                                                                            dtype: torch.dtype) -> None:
    tensors = source_state(SPEC)
    tensors[LAYER_KEY] = tensors[LAYER_KEY].to(dtype)
    src = write_mindformers(tmp_path / "bf16", tensors)
    result = _convert("megatron", src, tmp_path / "mg")
    _refused(result, f"wrong dtype {LAYER_KEY!r}: {str(dtype).removeprefix('torch.')}", "bfloat16")
    assert not (tmp_path / "mg").exists()


# --- held: missing, extra and mis-shaped tensors are named and nothing is written; SIGINT leaves nothing -----------

def test_missing_extra_and_misshaped_tensors_are_each_named_and_nothing_is_written(tmp_path: Path) -> None:
    tensors = source_state(SPEC)
    missing = "decoder.layers.1.mlp.linear_fc2.weight"
    del tensors[missing]
    tensors["decoder.layers.0.surprise"] = torch.zeros(3, dtype=torch.bfloat16)
    tensors[LAYER_KEY] = torch.zeros(7, 7, dtype=torch.bfloat16)
    src = write_mindformers(tmp_path / "bf16", tensors)
    result = _convert("megatron", src, tmp_path / "mg")
    _refused(result, f"missing MindFormers key {missing!r}", "unused MindFormers key 'decoder.layers.0.surprise'",
             f"wrong shape {LAYER_KEY!r}")
    assert not (tmp_path / "mg").exists()
    assert staging_leftovers(tmp_path) == []


def test_sigint_during_a_conversion_leaves_nothing(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    write_mindformers(tmp_path / "base", {"w": torch.ones(32 << 20)})  # 128 MB: long enough to interrupt
    proc = subprocess.Popen([sys.executable, "-m", "alignflow", "convert", "bf16", str(tmp_path / "base"),
                             str(tmp_path / "bf16")], env=subprocess_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not staging_leftovers(tmp_path):
        assert proc.poll() is None, "the conversion ended before the interrupt"
        assert time.monotonic() < deadline, "the conversion never staged its output"
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not (tmp_path / "bf16").exists()
    assert staging_leftovers(tmp_path) == []
