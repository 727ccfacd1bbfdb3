"""The parser, the sentinels and the first-interval correction on a real Megatron-LM log.

`tests/data/logs/megatron_core_v0.19_h200.log` is the stdout of the demo's gpu_train step with real Megatron-LM
(core_v0.19.0 source tree, megatron-core 0.19.1, torch 2.11 + CUDA 13, one H200, no Transformer Engine, no Apex,
fp32, `--deterministic-mode`), run exactly as `alignflow render demo-megatron gpu_train --hosts ... --script` printed
it, 30 iterations from the demo's convert_megatron output (`--megatron-version 0.19`). Only the 815 lines of
Megatron's argument dump and the gradient bucket's parameter list are left out. The MindSpore twin's log of the
same training (`mindspore_twin_demo_npu_reload.log`, the demo's npu_reload_train on a CPU; its run directory in the
log-line prefix replaced by /data/alignflow/...) is the other side: it prints each step's own loss, which is the
truth the de-averaged iteration 2 must reproduce.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config.criteria import default_criteria
from alignflow.logs import check_sentinels, parse_log_file
from alignflow.logs.schema import ParsedLog

DATA = Path(__file__).resolve().parent.parent / "data" / "logs"
MEGATRON = DATA / "megatron_core_v0.19_h200.log"
NPU = DATA / "mindspore_twin_demo_npu_reload.log"


@pytest.fixture(scope="module")
def megatron() -> ParsedLog:
    return parse_log_file(MEGATRON)


@pytest.fixture(scope="module")
def npu() -> ParsedLog:
    return parse_log_file(NPU)


def test_the_real_log_parses_as_thirty_megatron_iterations(megatron: ParsedLog) -> None:
    assert megatron.fmt == "megatron"
    assert megatron.steps == list(range(1, 31))
    f = megatron.frame
    assert {"lm_loss", "load_balancing_loss", "mtp_1_loss", "grad_norm", "lr"} <= set(f.columns)
    # iteration 1 as printed: ` lm loss: 5.044528E+00 | load_balancing_loss: 1.035217E+00 | mtp_1 loss: ...`
    assert (f.loc[1, "lm_loss"], f.loc[1, "load_balancing_loss"], f.loc[1, "mtp_1_loss"]) == (5.044528, 1.035217,
                                                                                           5.105352)
    assert (f.loc[1, "grad_norm"], f.loc[30, "lm_loss"], f.loc[30, "lr"]) == (7.145, 3.931735, 1e-3)
    assert f.loc[3, "lr"] == 1e-3
    assert f.loc[2, "lr"] == pytest.approx(6.666667e-4)


def test_the_real_load_is_a_good_load_and_the_memory_lines_are_not_steps(megatron: ParsedLog) -> None:
    check_sentinels(megatron, require=("checkpoint_loaded",))
    assert megatron.sentinels == ()
    text = MEGATRON.read_text()
    assert " loading checkpoint from /tmp/af/inputs/megatron_ckpt at iteration 1\n" in text
    assert " checkpoint version 3.0\n" in text
    assert ("  successfully loaded checkpoint from /tmp/af/inputs/megatron_ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at "
            "iteration 0\n") in text
    assert "[Rank 0] (after 1 iterations) memory (MB)" in text  # present, and not taken for a step line


def test_the_first_interval_of_the_real_log_is_de_averaged_to_the_other_sides_step_two(
        megatron: ParsedLog, npu: ParsedLog) -> None:
    note = megatron.first_interval
    assert note is not None
    assert note.corrected_steps == (2,)
    (interval,) = note.intervals
    assert (interval.first_step, interval.step) == (1, 2)
    assert "microsecond timestamps" in interval.reason
    assert set(interval.columns) == {"lm_loss", "load_balancing_loss", "mtp_1_loss"}
    raw = parse_log_file(MEGATRON, first_interval="raw")
    assert raw.frame.loc[2, "lm_loss"] == 5.018517  # printed: the mean of iterations 1 and 2
    step2 = megatron.frame.loc[2, "lm_loss"]
    assert step2 == pytest.approx(2 * 5.018517 - 5.044528, abs=1e-9)
    truth = npu.frame.loc[2, "lm_loss"]  # MindSpore prints step 2's own loss
    assert abs(step2 - truth) < 3e-6  # within 3 half-units of the printed 1e-6 (twice 1 printed value + 1)
    assert abs(raw.frame.loc[2, "lm_loss"] - truth) > 1e-2  # uncorrected, it would look misaligned


def test_the_real_pair_passes_with_a_step_one_difference_below_one_in_a_million(
        megatron: ParsedLog, npu: ParsedLog) -> None:
    from alignflow.compare.comparison import compare

    result = compare(npu, megatron, default_criteria())
    assert result.verdict == "pass", result.reasons
    lm = result.metrics["lm_loss"]
    assert abs(lm.at_steps["step_rel"][1]) < 1e-6
    assert abs(lm.stats.get("me")) < 1e-5
    assert result.steps.compared == 30
