"""Logs as people paste them (issue 33): the four classes that public logs showed, each on lines written with the
frameworks' own format strings (alignflow.logs.render, docs/megatron.md#the-training_log-line), then damaged the
way the public logs were.

1. another process's text glued after a Megatron line's last `|` (Megatron's own `> padded vocab ...` line);
2. lines that lost their final ` |`, lines wrapped in parentheses, a line a document wrapped in the middle of a
   field name;
3. MindSpore model-zoo monitors that count epochs (and steps in an epoch) from 0;
4. RFC 3339 timestamps before the step lines.

Every complete value must read exactly as in the undamaged log, and a healthy run gives no fatal sentinel; what
was not read is a warning with its line number. Plus: a log holding a bad run followed by a good run of the same
steps names its runs and the one compared.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from alignflow.logs import parse_log
from tests.logfixtures import make_run, megatron_lines, training_log

# Megatron-LM `_vocab_size_with_padding` (megatron/training/tokenizer/tokenizer.py), printed by rank 0 while the
# last rank prints its iteration lines: in a merged log the two can end up on one line.
PADDED_VOCAB = " > padded vocab (size: 50257) with 431 dummy tokens (new size: 50688)"


def _log(n: int = 12) -> list[str]:
    return megatron_lines(make_run(n, seed=7))


def _same_values(parsed: object, reference: object, *, steps: list[int] | None = None) -> None:
    a, b = parsed.frame, reference.frame  # type: ignore[attr-defined]
    if steps is not None:
        a, b = a.loc[steps], b.loc[steps]
    pd.testing.assert_frame_equal(a, b, check_like=True)


def _kinds(parsed: object) -> list[tuple[int, str, bool]]:
    return [(s.line_no, s.kind, s.fatal) for s in parsed.sentinels if s.kind != "first_interval_averaged"]  # type: ignore[attr-defined]


def test_class1_text_glued_after_the_last_field_keeps_every_field_and_is_no_fatal() -> None:
    lines = _log()
    clean = parse_log(lines)
    lines[4] = lines[4].rstrip("\n") + PADDED_VOCAB + "\n"
    parsed = parse_log(lines)
    _same_values(parsed, clean)
    assert not parsed.fatal_sentinels
    found = {s.kind: s for s in parsed.sentinels}
    assert found["partial_step_line"].line_no == 5
    assert "> padded vocab (size: 50257)" in found["partial_step_line"].message
    assert found["megatron_padded_vocab"].line_no == 5  # the glued line is still read for what it says


def test_class1_a_second_step_line_glued_on_is_not_merged_into_the_first() -> None:
    lines = _log()
    clean = parse_log(lines)
    glued = lines[3].rstrip("\n") + lines[4]
    parsed = parse_log([*lines[:3], glued, *lines[5:]])
    assert parsed.frame.loc[4].equals(clean.frame.loc[4])  # step 4's fields, not step 5's over them
    assert not parsed.fatal_sentinels
    assert "another step line glued" in next(s.message for s in parsed.sentinels if s.kind == "partial_step_line")


def test_class2_lines_that_lost_their_final_bar_read_every_value() -> None:
    lines = _log()
    clean = parse_log(lines)
    parsed = parse_log([line.rstrip("\n").rstrip(" |") + "\n" for line in lines])
    _same_values(parsed, clean)  # the last field (`number of nan iterations:   0`) is whole: read
    assert _kinds(parsed) == []


@pytest.mark.parametrize(("before", "after"), [("(", ")"), ('"', '"'), ("> ", ""), ("(", "),")])
def test_class2_lines_wrapped_in_other_characters_read_every_value(before: str, after: str) -> None:
    lines = _log()
    clean = parse_log(lines)
    parsed = parse_log([before + line.rstrip("\n") + after + "\n" for line in lines])
    _same_values(parsed, clean)
    assert _kinds(parsed) == []


@pytest.mark.parametrize("where", ["grad n|orm", "number of sk|ipped", "lm loss: 2.|", "learning |rate",
                                   "after the bar", "before the bar"])
def test_class2_a_line_wrapped_in_two_inside_a_field_is_read_as_one(where: str) -> None:
    lines = _log()
    clean = parse_log(lines)
    head, _, tail = where.partition("|")
    text = lines[6].rstrip("\n")
    if head.endswith(": 2."):  # inside a value: break after its first digits
        key = head.split(":")[0]
        at = text.index(key) + len(key) + 4
    elif where == "after the bar":  # between two fields: the first line looks whole
        at = text.index("| loss scale") + 2
    elif where == "before the bar":
        at = text.index("| loss scale")
    else:
        at = text.index(head + tail) + len(head)
    wrapped = [*lines[:6], text[:at] + "\n", text[at:] + "\n", *lines[7:]]
    parsed = parse_log(wrapped)
    _same_values(parsed, clean)
    (note,) = [s for s in parsed.sentinels if s.kind == "partial_step_line"]
    assert (note.line_no, note.fatal) == (7, False)
    assert "line 8 continues this line" in note.message
    assert not parsed.fatal_sentinels


def test_class2_a_line_cut_inside_a_value_reads_the_fields_before_and_says_what_was_not_read() -> None:
    lines = _log()
    clean = parse_log(lines)
    text = lines[6]
    cut = text[:text.index("lm loss") + len("lm loss: 2.3")]
    lines[6] = cut + "\n"
    parsed = parse_log(lines)
    row, ref = parsed.frame.loc[7], clean.frame.loc[7]
    for column in ("consumed_samples", "lr", "step_time_ms", "global_batch_size"):
        assert row[column] == ref[column]
    assert pd.isna(row["lm_loss"])  # cut: not read, never guessed
    (note,) = [s for s in parsed.sentinels if s.kind == "partial_step_line"]
    assert note.line_no == 7
    assert f"`{cut[cut.index('lm loss'):]}`: the line ends inside this field" in note.message
    assert not parsed.fatal_sentinels  # a cut is no damaged value
    _same_values(parsed, clean, steps=[s for s in clean.steps if s != 7])


def test_class2_a_really_damaged_value_is_fatal() -> None:
    lines = _log()
    lines[6] = lines[6].replace("grad norm: ", "grad norm: 1.2.", 1)
    parsed = parse_log(lines)
    (bad,) = parsed.fatal_sentinels
    assert (bad.kind, bad.line_no) == ("damaged_value", 7)
    assert "grad_norm" in bad.message


def _zoo_monitor(epochs: int, per_epoch: int, *, zero_based: bool, every: int = 1) -> list[str]:
    """MindSpore model-zoo `Monitor.step_end` (e.g. models/official/cv/MobileNetV2 `src/utils.py`): `epoch:
    [{:3d}/{:3d}], step:[{:5d}/{:5d}], loss:[{:5.3f}/{:5.3f}], time:[{:5.3f}], lr:[{:5.3f}]`, printing
    `cur_epoch_num - 1` and `(cur_step_num - 1) % batch_num` (0-based), or in other copies `cur_epoch_num` and
    `cur_step_in_epoch + 1` (1-based)."""
    out = []
    for g in range(1, epochs * per_epoch + 1):
        if g % every:
            continue
        epoch, step = (g - 1) // per_epoch, (g - 1) % per_epoch
        if not zero_based:
            epoch, step = epoch + 1, step + 1
        loss = 7.0 - g * 0.001
        out.append(f"epoch: [{epoch:3d}/{epochs:3d}], step:[{step:5d}/{per_epoch:5d}], loss:[{loss:5.3f}/{loss:5.3f}]"
                   f", time:[{123.456:5.3f}], lr:[{0.1:5.3f}]\n")
    return out


@pytest.mark.parametrize("zero_based", [True, False])
def test_class3_epochs_counted_from_zero_or_one_give_the_same_steps(zero_based: bool) -> None:
    parsed = parse_log(_zoo_monitor(3, 5, zero_based=zero_based))
    assert parsed.steps == list(range(1, 16))
    assert parsed.max_steps == 15
    assert parsed.frame.loc[1, "lm_loss"] == 6.999
    assert parsed.sentinels == ()  # no incomplete_run: the run reached 15 of 15
    assert ("epochs from 0" in parsed.variant) == zero_based


def test_class3_the_issues_line_shape_counts_steps_in_an_epoch_from_one() -> None:
    """`Epoch:[  0/  5], step:[  375/ 1875], loss:[...]`: epoch 0 proves 0-based epochs; the steps printed reach 1875
    of 1875, which only a 1-based step counter prints."""
    lines = [f"Epoch:[{e:3d}/{5:3d}], step:[{s:5d}/{1875:5d}], loss:[{2.0:5.3f}/{2.0:5.3f}], time:[{9.9:5.3f}]\n"
             for e in range(5) for s in range(375, 1876, 375)]
    parsed = parse_log(lines)
    assert parsed.steps == list(range(375, 9376, 375))
    assert min(parsed.steps) > 0
    assert not [s for s in parsed.sentinels if s.kind == "incomplete_run"]


def test_class3_mindformers_own_epochs_stay_one_based() -> None:
    parsed = parse_log(_zoo_monitor(2, 4, zero_based=False, every=2))  # no epoch 0, no step 0: nothing says 0-based
    assert parsed.steps == [2, 4, 6, 8]


@pytest.mark.parametrize(("stamp", "evidence"), [
    ("[2025-10-21T16:18:53+08:00]", "seconds-only timestamps"),
    ("[2025-10-21T16:18:53.123456+08:00]", "microsecond timestamps"),
    ("2025-10-21T08:18:53.123456789Z", "microsecond timestamps"),  # kubectl logs --timestamps
    ("[2025-10-21T16:18:53Z]", "seconds-only timestamps"),
])
def test_class4_rfc3339_timestamps_are_timestamps_to_the_first_interval(stamp: str, evidence: str) -> None:
    its = [{"lm loss": 3.0 - 0.1 * i} for i in range(4)]
    lines = [line.replace(line[line.index("["):line.index("]") + 1], stamp, 1) if "iteration" in line else line
             for line in training_log(its)]
    parsed = parse_log(lines)
    note = parsed.first_interval
    assert note is not None
    assert evidence in note.intervals[0].reason
    assert "no timestamp" not in note.intervals[0].reason
    assert ("microsecond" in evidence) == (2 in note.corrected_steps)


def _restarted() -> tuple[list[str], list[str]]:
    good = megatron_lines(make_run(10, seed=3))
    bad = [line.replace("lm loss: ", "lm loss: 9", 1) for line in megatron_lines(make_run(10, seed=5))[:6]]
    return bad, good


def test_a_bad_run_followed_by_a_good_run_names_both_and_the_compared_one() -> None:
    bad, good = _restarted()
    parsed = parse_log([*bad, *good])
    _same_values(parsed, parse_log(good))
    (restart,) = [s for s in parsed.sentinels if s.kind == "restart"]
    assert (restart.line_no, restart.fatal) == (7, False)
    assert "goes back from 6 to 1" in restart.message
    assert "compared: run 2 (lines 7-16, steps 1-10)" in restart.message
    assert "not compared: run 1 (lines 1-6, steps 1-6)" in restart.message


@pytest.mark.integration  # the CLI in a real process
def test_a_restarted_log_is_said_in_the_terminal_the_report_and_the_json(tmp_path: object,
                                                                         subprocess_env: dict[str, str]) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(str(tmp_path))
    bad, good = _restarted()
    (root / "test.log").write_text("".join([*bad, *good]))
    (root / "ref.log").write_text("".join(good))
    done = subprocess.run([sys.executable, "-m", "alignflow", "compare", str(root / "ref.log"), str(root / "test.log"),
                           "--out", str(root / "report"), "--no-plots"], capture_output=True, text=True,
                          env=subprocess_env, timeout=300)
    assert done.returncode == 0, done.stderr
    said = "the step counter goes back from 6 to 1"
    terminal = " ".join(done.stdout.split())  # rich folds long lines at the terminal's width
    assert f"test: line 7: {said}" in terminal
    assert "compared: run 2 (lines 7-16, steps 1-10)" in terminal
    doc = json.loads((root / "report" / "comparison.json").read_text())
    assert said in json.dumps(doc)
    assert said in (root / "report" / "summary.md").read_text()
    assert said in (root / "report" / "report.html").read_text()


def test_a_merged_megatron_core_016_log_reads_the_last_rank_with_the_glued_line_said() -> None:
    """tests/data/logs/wild/mcore016_tee_merged.log: four ranks under torchrun `--tee`, microsecond timestamps,
    rank 0's `> padded vocab` glued onto the first iteration line."""
    from pathlib import Path

    from alignflow.logs import parse_log_file

    log = Path(__file__).resolve().parent.parent / "data" / "logs" / "wild" / "mcore016_tee_merged.log"
    parsed = parse_log_file(log)
    assert (parsed.rank, parsed.steps) == (3, list(range(1, 21)))
    text = log.read_text().splitlines()
    first = text[7]
    assert parsed.frame.loc[1, "grad_norm"] == float(first.split("grad norm: ")[1].split(" ")[0])
    assert parsed.frame.loc[20, "lm_loss"] == float(text[-1].split("lm loss: ")[1].split(" ")[0])
    assert parsed.first_interval is not None
    assert parsed.first_interval.corrected_steps == (2,)  # megatron-core >= 0.16: told by the microseconds
    assert not parsed.fatal_sentinels
    assert {(s.line_no, s.kind) for s in parsed.sentinels} == {(8, "partial_step_line"), (8, "megatron_padded_vocab")}


def test_a_mindformers_log_merged_by_mpirun_tag_output_reads_the_last_stage() -> None:
    from pathlib import Path

    from alignflow.logs import parse_log_file

    log = Path(__file__).resolve().parent.parent / "data" / "logs" / "wild" / "mindformers_mpirun_tagged.log"
    parsed = parse_log_file(log)
    assert parsed.ranks == (0, 1, 2, 3)
    assert parsed.rank == 3
    assert parsed.steps == list(range(1, 11))
    last = [line for line in log.read_text().splitlines() if line.startswith("[1,3]<stdout>:")][-1]
    assert parsed.frame.loc[10, "lm_loss"] == float(last.split("loss: ")[1].split(",")[0])
    assert parsed.sentinels == ()
