"""Real Megatron-LM loading alignflow's torch_dist checkpoint (issue 36 / 38, one GPU).

Both logs are the stdout of the demo's gpu_train step with real Megatron-LM (core_v0.19.0 source tree, torch 2.11 +
CUDA 13, one H100, no Transformer Engine, fp32, `--deterministic-mode`), 30 iterations, in one session of the
`device` machine, each script exactly as `alignflow render … gpu_train --script` printed it:

- `megatron_core_v0.19_h100_legacy.log`: demo-megatron as shipped (`--ckpt-format torch`, the legacy
  `mp_rank_00/model_optim_rng.pt` that convert_megatron writes at TP = PP = 1);
- `megatron_core_v0.19_h100_torch_dist.log`: the same experiment with `conversion.format: torch_dist`
  (`--ckpt-format torch_dist`, the checkpoint alignflow writes through megatron-core's own `dist_checkpointing`).

Only Megatron's argument dump and the gradient bucket's parameter list are left out. A multi-GPU machine was not
lent; the TP/PP/EP = 2 loads of the same checkpoint are proven on CPU with gloo (tests/convert/test_megatron_core_dist).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.compare.memory import memory_summary
from alignflow.config.criteria import default_criteria
from alignflow.logs import check_sentinels, parse_log_file
from alignflow.logs.memory import memory_lines
from alignflow.logs.schema import ParsedLog

DATA = Path(__file__).resolve().parent.parent / "data" / "logs"
LEGACY = DATA / "megatron_core_v0.19_h100_legacy.log"
TORCH_DIST = DATA / "megatron_core_v0.19_h100_torch_dist.log"
NPU = DATA / "mindspore_twin_demo_npu_reload.log"


@pytest.fixture(scope="module")
def logs() -> dict[str, ParsedLog]:
    return {"legacy": parse_log_file(LEGACY), "torch_dist": parse_log_file(TORCH_DIST), "npu": parse_log_file(NPU)}


def test_real_megatron_loaded_the_torch_dist_checkpoint_without_missing_keys(logs: dict[str, ParsedLog]) -> None:
    text = TORCH_DIST.read_text()
    assert " loading distributed checkpoint from /tmp/af/inputs/megatron_td at iteration 1\n" in text
    assert ("  successfully loaded checkpoint from /tmp/af/inputs/megatron_td [ t 1/1, gtp_remat 1/1, p 1/1 ] at "
            "iteration 0\n") in text
    assert "load_return" not in text
    assert "missing" not in text.lower()
    check_sentinels(logs["torch_dist"], require=("checkpoint_loaded",))
    assert logs["torch_dist"].sentinels == ()
    assert logs["torch_dist"].steps == list(range(1, 31))


def test_torch_dist_and_legacy_trainings_are_bit_identical(logs: dict[str, ParsedLog]) -> None:
    legacy, dist = logs["legacy"].frame, logs["torch_dist"].frame
    metrics = ["lm_loss", "load_balancing_loss", "mtp_1_loss", "grad_norm", "lr"]
    assert set(metrics) <= set(dist.columns)
    assert dist[metrics].equals(legacy[metrics])


def test_torch_dist_training_passes_against_the_mindspore_twin(logs: dict[str, ParsedLog]) -> None:
    from alignflow.compare.comparison import compare

    result = compare(logs["npu"], logs["torch_dist"], default_criteria())
    assert result.verdict == "pass", result.reasons
    lm = result.metrics["lm_loss"]
    assert abs(lm.at_steps["step_rel"][1]) < 1e-6
    assert result.steps.compared == 30


def test_the_per_rank_peak_memory_of_the_real_run_is_read() -> None:
    summary = memory_summary(memory_lines(TORCH_DIST.read_text().splitlines()))
    assert summary is not None
    assert (summary.metric, summary.per_rank, summary.sources) == ("max_allocated_mb", ((0, 86.38),), ("megatron",))
    assert (summary.max_rank, summary.avg_rank, summary.peak_rank) == (86.38, 86.38, 0)
