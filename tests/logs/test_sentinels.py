"""Sentinel lines: a run that exited 0 can still be invalid, and the parse says which line proves it."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.errors import LogParseError, SentinelError
from alignflow.logs import CHECKPOINT_LOADED, check_sentinels, parse_log, parse_log_file
from tests.logfixtures import make_run, megatron_lines, mindformers_lines

DATA = Path(__file__).resolve().parent.parent / "data" / "logs"


def test_megatron_non_strict_load_is_fatal_even_after_a_successful_load_line() -> None:
    parsed = parse_log_file(DATA / "megatron_nonstrict_load.log")
    assert parsed.steps == [1, 2, 3]
    found = [(s.line_no, s.kind, s.fatal) for s in parsed.sentinels]
    assert found == [(2, "megatron_padded_vocab", False), (5, "megatron_nonstrict_load", True)]
    assert parsed.markers == {"checkpoint_load_started": 3, "checkpoint_loaded": 6, "training_started": 7}
    with pytest.raises(SentinelError) as info:
        check_sentinels(parsed)
    message = str(info.value)
    assert "megatron_nonstrict_load.log:5: megatron_nonstrict_load" in message
    assert "load_return: None" in message
    assert [s.line_no for s in info.value.sentinels] == [5]


def test_mindformers_random_init_and_unloaded_parameters_are_fatal() -> None:
    parsed = parse_log_file(DATA / "mindformers_random_init.log")
    found = {s.kind: s for s in parsed.sentinels}
    assert found["mf_random_init"].fatal_under([CHECKPOINT_LOADED])
    assert found["mf_random_init"].line_no == 2
    params = found["mf_network_params_not_loaded"]
    assert params.fatal
    assert params.line_no == 3
    assert "decoder.layers.0.mlp.linear_fc1.weight, decoder.layers.1.mlp.linear_fc1.weight" in params.message
    counters = found["mf_checkpoint_weights_not_loaded"]
    assert not counters.fatal
    assert "only per-step counters" in counters.message
    assert parsed.markers["mf_pynative_start"] == 1
    assert "mf_all_network_params_loaded" not in parsed.markers
    with pytest.raises(SentinelError, match=r"1 fatal line"):
        check_sentinels(parsed)
    with pytest.raises(SentinelError, match=r"2 fatal line\(s\), 1 required line\(s\) missing"):
        check_sentinels(parsed, require=[CHECKPOINT_LOADED])


MEGATRON_FATAL = [
    (">> '--exit-on-missing-checkpoint' set ... exiting. <<", "megatron_exit_on_missing_checkpoint"),
    ("ERROR: Invalid metadata file runs/demo/latest_checkpointed_iteration.txt. Exiting", "megatron_invalid_tracker"),
    ("could not load the checkpoint", "megatron_checkpoint_unreadable"),
    ("size mismatch for embedding.word_embeddings.weight: copying a param with shape torch.Size([136, 64]) from "
     "checkpoint, the shape in current model is torch.Size([128, 64]).", "megatron_size_mismatch"),
    ("FileNotFoundError: Can not find 'common.json' file at: 'runs/demo/bf16/iteration_00000010'",
     "mf_common_json_missing"),
    ("ValueError: Duplicate parameter_name found: decoder.final_layernorm.weight", "mf_duplicate_parameter"),
    ("[SkipStepOnNaN] Global gradient norm is nan at step 7, skipping the optimizer update", "mf_skip_step_on_nan"),
]


@pytest.mark.parametrize(("line", "kind"), MEGATRON_FATAL, ids=[k for _, k in MEGATRON_FATAL])
def test_each_fatal_line_is_found_with_its_line_number(line: str, kind: str) -> None:
    lines = ["[default0]:starting\n", f"[default0]:{line}\n", *megatron_lines(make_run(3), rank_prefix="[default0]:")]
    parsed = parse_log(lines)
    assert [(s.line_no, s.kind, s.fatal, s.rank) for s in parsed.sentinels] == [(2, kind, True, 0)]
    assert parsed.sentinels[0].text == line.strip()


FROM_RANDOM = [
    ("    will not load any checkpoints and will start from random", "megatron_no_checkpoint"),
    ("[2026-08-20 10:14:58,310] WARNING: Checkpoint directory is empty: runs/demo/bf16. Skipping checkpoint "
     "loading, model will use random initialization.", "mf_random_init"),
]


@pytest.mark.parametrize(("line", "kind"), FROM_RANDOM, ids=[k for _, k in FROM_RANDOM])
def test_starting_from_random_weights_is_fatal_only_when_a_loaded_checkpoint_is_required(line: str, kind: str) -> None:
    """Issue 15 item 10: `alignflow compare` of a from-scratch run is no failure; the pipeline's trainings, which
    require a loaded checkpoint, fail on the same line."""
    parsed = parse_log([f"{line}\n", *megatron_lines(make_run(3))], source="gpu.log")
    assert [(s.line_no, s.kind, s.fatal, s.fatal_when) for s in parsed.sentinels] == [
        (1, kind, False, CHECKPOINT_LOADED)]
    check_sentinels(parsed)
    with pytest.raises(SentinelError) as info:
        check_sentinels(parsed, require=[CHECKPOINT_LOADED])
    assert f"gpu.log:1: {kind}" in str(info.value)
    assert "gpu.log: required line not found: checkpoint_loaded" in str(info.value)
    assert [s.kind for s in info.value.sentinels] == [kind]


@pytest.mark.parametrize(("line", "kind"), [
    ("successfully fixed query-key-values ordering for checkpoint version 0", "megatron_qkv_reordered"),
    ("Optimizer parameters not loaded:", "mf_optimizer_not_loaded"),
])
def test_warning_lines_are_reported_but_not_fatal(line: str, kind: str) -> None:
    parsed = parse_log([line + "\n", *megatron_lines(make_run(2))])
    assert [(s.kind, s.fatal) for s in parsed.sentinels] == [(kind, False)]
    check_sentinels(parsed)


def test_padded_vocab_without_dummy_rows_is_fine() -> None:
    parsed = parse_log([" > padded vocab (size: 1024) with 0 dummy tokens (new size: 1024)\n",
                        *megatron_lines(make_run(2))])
    assert parsed.sentinels == ()


def test_required_marker_missing_is_reported() -> None:
    parsed = parse_log(megatron_lines(make_run(2)), source="gpu.log")
    check_sentinels(parsed)
    with pytest.raises(SentinelError, match=r"gpu.log: required line not found: checkpoint_loaded"):
        check_sentinels(parsed, require=["checkpoint_loaded"])


def test_a_log_that_stopped_at_a_fatal_line_says_so_in_the_parse_error() -> None:
    lines = [" loading checkpoint from runs/demo at iteration 1\n", "could not load the checkpoint\n",
             "WeightsUnpickler error: Unsupported global\n"]
    with pytest.raises(LogParseError, match=r"no step lines.*fatal line.*2: could not load the checkpoint"):
        parse_log(lines, source="gpu.log")


def test_many_fatal_lines_are_summarised_in_the_message_but_all_kept() -> None:
    run = make_run(300)
    for i in range(run.n):
        run.lm_loss[i] = float("inf")
    parsed = parse_log(mindformers_lines(run))
    with pytest.raises(SentinelError) as info:
        check_sentinels(parsed)
    assert len(info.value.sentinels) == 300
    assert "... and 100 more fatal line(s)" in str(info.value)


def test_skipped_iterations_and_loss_scale_overflow_are_warnings() -> None:
    from alignflow.logs.render import megatron_line, mindformers_legacy_line

    mg = [megatron_line(s, 3, consumed_samples=s, elapsed_ms=1.0, lr=1e-4, global_batch_size=1,
                        losses={"lm loss": 2.0}, grad_norm=1.0, skipped=int(s == 3)) + "\n" for s in (1, 2, 3)]
    parsed = parse_log(mg)
    assert [(s.line_no, s.kind, s.fatal) for s in parsed.sentinels] == [(3, "skipped_iterations", False)]
    legacy = [mindformers_legacy_line(1, 1, s, 3, loss=2.0, step_time_ms=5, lr=1e-5, global_norm=1.0,
                                      overflow=s == 3, loss_scale="65536.0") + "\n" for s in (1, 2, 3)]
    parsed = parse_log(legacy)
    assert [(s.line_no, s.kind, s.fatal) for s in parsed.sentinels] == [(3, "overflow", False)]
    check_sentinels(parsed)
