"""Proof of issue 21: each seed bug injected into one side of the twin is named by `diagnose` — the module (or
the optimizer) and the cause class — and the clean twin passes.

Real MindSpore and PyTorch trainings (one dumped step each), launched through local transports exactly as the
pipeline launches them; conversion bugs are written into the converted Megatron checkpoint, the others are the
twin's injection switches in one side's environment (`ALIGNFLOW_TWIN_INJECT`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from alignflow.config.hosts import Host
from alignflow.convert.engine import convert_to_megatron
from alignflow.convert.layout import checkpoint_path
from alignflow.convert.ops import InterleaveRows
from alignflow.convert.registry import SPEC_DIR
from alignflow.diagnose.core import Checkpoints, DataRef, run_diagnosis
from alignflow.transport import open_transport
from tests.diagnose.conftest import Converted, experiment

pytestmark = pytest.mark.slow

SHARED_FC1 = "decoder.layers.2.mlp.shared_experts.linear_fc1.weight"
EXPERT_FC1 = "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"


def corrupt(megatron: Path, key: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    path = megatron / checkpoint_path(1)
    payload = torch.load(path, map_location="cpu", weights_only=True)
    payload["model"][key] = fn(payload["model"][key]).contiguous().clone()
    torch.save(payload, path)


def not_deinterleaved(t: torch.Tensor) -> torch.Tensor:
    """The MindFormers rows as they were, [g0, u0, g1, u1, ...]: the converter skipped the de-interleave."""
    (out,) = InterleaveRows(0).apply([t])
    return out


def inject(text: str) -> dict[str, Any]:
    return {"env": {"ALIGNFLOW_TWIN_INJECT": text}}


# name: (checkpoint corruption, experiment sides, expected cause kind, expected module)
CASES: dict[str, tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor]] | None, dict[str, Any], str | None,
                       str | None]] = {
    "clean": (None, {}, None, None),
    "shared_fc1_not_deinterleaved": ((SHARED_FC1, not_deinterleaved), {}, "conversion",
                                     "decoder.layers.2.mlp.shared_experts.linear_fc1"),
    "expert_weight1_not_transposed": ((EXPERT_FC1, lambda t: t.T), {}, "conversion",
                                      "decoder.layers.1.mlp.experts.local_experts.1.linear_fc1"),
    "gelu_on_npu": (None, {"npu": inject("activation=gelu")}, "forward", "decoder.layers.0.mlp"),
    "rope_base_1e6_on_gpu": (None, {"gpu": inject("rotary_base=1e6")}, "forward", "decoder.layers.0.self_attention"),
    "no_topk_renorm_on_npu": (None, {"npu": inject("norm_topk_prob=false")}, "forward", "decoder.layers.1.mlp.router"),
    "adam_eps_on_gpu": (None, {"gpu": inject("adam_eps=1e-6")}, "optimizer", "optimizer"),
    "bf16_writeback_on_npu": (None, {"npu": inject("bf16_writeback=true")}, "optimizer", "optimizer"),
}


BROKEN_SPEC = "spec_without_shared_deinterleave"  # converted and diagnosed through the broken spec itself


@pytest.mark.parametrize("case", [*CASES, BROKEN_SPEC])
def test_diagnose_names_module_and_cause(case: str, converted: Converted, hosts: dict[str, Host],
                                         tmp_path: Path) -> None:
    if case == BROKEN_SPEC:  # what tests/flows/test_gate.py breaks: the weights agree through it after load
        spec = tmp_path / "twin-moe.yaml"
        text = (SPEC_DIR / "twin-moe.yaml").read_text()
        spec.write_text(text.replace("ops: [deinterleave_rows], shape: [2 * shared_ffn", "shape: [2 * shared_ffn"))
        assert spec.read_text() != text
        megatron = tmp_path / "megatron"
        convert_to_megatron(converted.bf16, megatron, spec=str(spec))
        exp = experiment(converted, spec=str(spec))
        kind, module = "conversion", "decoder.layers.1.mlp.shared_experts.linear_fc1"
    else:
        corruption, sides, kind, module = CASES[case]
        megatron = converted.megatron
        if corruption is not None:
            megatron = tmp_path / "megatron"
            shutil.copytree(converted.megatron, megatron)
            corrupt(megatron, *corruption)
        exp = experiment(converted, **sides)
    transports = {side: open_transport(host) for side, host in hosts.items()}
    result = run_diagnosis(exp, checkpoints=Checkpoints(npu=str(converted.bf16), gpu=str(megatron)),
                           data=DataRef(str(converted.data), str(converted.data), converted.sha256),
                           transport=transports, out_dir=tmp_path / "out", step=1)
    d = result.diagnosis
    found = (d.cause.kind, d.cause.module) if d.cause else (None, None)
    assert found == (kind, module), d.cause
    assert d.verdict == ("pass" if kind is None else "diverged")
    assert result.json_path.is_file()
    assert result.html_path.is_file()
    if kind is not None:
        assert 'id="af-first-divergence"' in result.html_path.read_text()
