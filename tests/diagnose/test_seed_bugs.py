"""Proof of issue 21: each seed bug injected into one side of the twin is named by `diagnose` — the module (or
the optimizer) and the cause class — and the clean twin passes.

Real MindSpore and PyTorch trainings (one dumped step each), launched through local transports exactly as the
pipeline launches them; conversion bugs are written into the converted Megatron checkpoint, the others are the
twin's injection switches in one side's environment (`ALIGNFLOW_TWIN_INJECT`).

The clean case is `run_diagnosis` end to end. A bug touches one side: the other side's training is then the clean
one (the same rendered command, checkpoint and data), whose dump the cases share (`SideDumps`) instead of training
it again: 4 MindSpore and 6 PyTorch trainings for the clean twin and the 8 bugs instead of 9 and 9.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from alignflow.backends import Side
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host
from alignflow.convert.engine import convert_to_megatron
from alignflow.convert.layout import checkpoint_path
from alignflow.convert.ops import InterleaveRows
from alignflow.convert.registry import SPEC_DIR
from alignflow.diagnose.compare import diagnose_dumps
from alignflow.diagnose.core import (
    Checkpoints,
    DataRef,
    SideRun,
    dump_step,
    run_diagnosis,
    side_training,
    write_outputs,
)
from alignflow.diagnose.mapping import mapping_for
from alignflow.frameworks.dumpfile import read_dump
from alignflow.transport import open_transport
from tests.diagnose.conftest import Converted, experiment, local_hosts

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


# name: (checkpoint corruption, experiment sides, expected cause kind, expected module); the clean twin is the test
# before them
CASES: dict[str, tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor]] | None, dict[str, Any], str, str]] = {
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


class SideDumps:
    """Each side's dump of step 1, made once per distinct training: the side's rendered command
    (`side_training`) and the checkpoint it loads (the data is the fixture's). The twin is deterministic, so a
    case reading the clean side's dump reads what training that side again would dump."""

    def __init__(self, root: Path, hosts: dict[str, Host], converted: Converted) -> None:
        self.root, self.converted = root, converted
        self.transports = {side: open_transport(host) for side, host in hosts.items()}
        self.made: dict[tuple[Side, str, str], Path] = {}

    def key(self, exp: Experiment, side: Side, checkpoint: Path) -> tuple[Side, str, str]:
        return side, repr(side_training(exp, side, self.converted.sha256)), str(checkpoint)

    def get(self, exp: Experiment, side: Side, checkpoint: Path) -> Path:
        key = self.key(exp, side, checkpoint)
        if key not in self.made:
            run = SideRun(self.transports[side], str(checkpoint), str(self.converted.data))
            out = self.root / f"dump-{len(self.made)}"
            self.made[key] = dump_step(exp, {side: run}, data_sha256=self.converted.sha256, out_dir=out, step=1)[side]
        return self.made[key]


@pytest.fixture(scope="module")
def side_dumps(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str],
               converted: Converted) -> SideDumps:
    root = tmp_path_factory.mktemp("side-dumps")
    return SideDumps(root, local_hosts(root, subprocess_env), converted)


def test_the_clean_twin_passes_through_run_diagnosis(converted: Converted, hosts: dict[str, Host],
                                                     side_dumps: SideDumps, tmp_path: Path) -> None:
    exp = experiment(converted)
    transports = {side: open_transport(host) for side, host in hosts.items()}
    result = run_diagnosis(exp, checkpoints=Checkpoints(npu=str(converted.bf16), gpu=str(converted.megatron)),
                           data=DataRef(str(converted.data), str(converted.data), converted.sha256),
                           transport=transports, out_dir=tmp_path / "out", step=1)
    d = result.diagnosis
    assert (d.verdict, d.cause) == ("pass", None)
    assert result.json_path.is_file()
    assert result.html_path.is_file()
    assert sorted(p.name for p in (tmp_path / "out" / "dumps").iterdir()) == ["gpu", "npu"]
    made: dict[Side, Path] = {"npu": converted.bf16, "gpu": converted.megatron}
    for side, checkpoint in made.items():  # the bug cases share these two
        side_dumps.made.setdefault(side_dumps.key(exp, side, checkpoint), result.dumps[side])


@pytest.mark.parametrize("case", [*CASES, BROKEN_SPEC])
def test_diagnose_names_module_and_cause(case: str, converted: Converted, side_dumps: SideDumps,
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
    dumps: dict[Side, Path] = {"npu": side_dumps.get(exp, "npu", converted.bf16),
                                "gpu": side_dumps.get(exp, "gpu", megatron)}
    (tmp_path / "out").mkdir()
    result = write_outputs(diagnose_dumps(read_dump(dumps["npu"]), read_dump(dumps["gpu"]), mapping_for(exp)),
                           tmp_path / "out", dumps)
    d = result.diagnosis
    found = (d.cause.kind, d.cause.module) if d.cause else (None, None)
    assert found == (kind, module), d.cause
    assert d.verdict == "diverged"
    assert result.json_path.is_file()
    assert result.html_path.is_file()
    assert 'id="af-first-divergence"' in result.html_path.read_text()
