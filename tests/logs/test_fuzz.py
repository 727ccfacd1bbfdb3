"""Fuzzing every line of the log fixtures: no input makes the parser raise anything but `LogParseError` (exit 2 with
the file, line and reason), and no input reaches its internal-error guard (issue 15).

Inputs: every line of tests/data/logs (the reference lines, the sentinel logs, the logs in the wild), one line per
shape (digits do not change which code runs). Mutations: truncation at every byte (alone, and as the unterminated
last line of a log), NaN/inf in every numeric field, random field order, CRLF, ANSI colour codes, 1 MB lines. Where
a mutation must not change what a line says (field order, CRLF, colour), the parse is compared with the original's;
where it makes a loss or grad norm non-finite, a fatal sentinel must say so. The CLI is run on the mutated logs too:
exit 0 or 2, never a traceback.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alignflow.compare.comparison import compare
from alignflow.config.criteria import default_criteria
from alignflow.errors import LogParseError
from alignflow.logs import ParsedLog, is_loss, parse_log
from alignflow.logs.formats import FORMATS
from alignflow.logs.lines import NUM

DATA = Path(__file__).resolve().parent.parent / "data" / "logs"
SETTINGS = settings(max_examples=100, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MB = 1 << 20
_NUMBER = re.compile(NUM)
_DIGITS = re.compile(r"\d+")
COUNTS: dict[str, int] = {}


def fixture_lines() -> list[str]:
    """One line per shape of every fixture log and reference line."""
    lines: list[str] = []
    for path in sorted([*DATA.glob("*.log"), *DATA.glob("wild/*.log")]):
        lines += path.read_text(encoding="utf-8").splitlines()
    for path in sorted(DATA.glob("*_lines.json")):
        lines += [case["line"] for case in json.loads(path.read_text(encoding="utf-8"))]
    shapes: dict[str, str] = {}
    for line in lines:
        shapes.setdefault(_DIGITS.sub("0", line), line)
    return list(shapes.values())


LINES = fixture_lines()


def _parses(lines: Sequence[str]) -> ParsedLog | None:
    """Parse; None for a refused log. Anything but a clean `LogParseError` fails the test."""
    COUNTS["parses"] = COUNTS.get("parses", 0) + 1
    try:
        parsed = parse_log(lines, source="fuzz.log")
    except LogParseError as exc:
        message = str(exc)
        assert "internal parser error" not in message, message
        assert message.startswith("fuzz.log"), message
        return None
    assert len(parsed.frame) > 0
    assert parsed.frame.index.is_unique
    parsed.summary()
    json.dumps([s.to_json() for s in parsed.sentinels])
    return parsed


STEP_LINES = [line for line in LINES if _parses([line]) is not None]


def test_the_fixtures_cover_every_format() -> None:
    variants = {p.variant for line in STEP_LINES if (p := _parses([line])) is not None}
    assert {"megatron", "legacy", "legacy-0.6", "pynative-g1", "pynative-g2", "pynative-g3", "nemo2"} <= variants
    assert len(LINES) > 60


@pytest.mark.slow  # exhaustive: tens of thousands of parses (make test runs it)
def test_truncation_at_every_byte() -> None:
    n = 0
    seen: set[str] = set()  # line shapes share their heads: a cut already parsed (the parse is deterministic) once
    for line in LINES:
        raw = line.encode("utf-8")
        whole, step_line = line + "\n", line in STEP_LINES
        for cut in range(len(raw) + 1):
            text = raw[:cut].decode("utf-8", errors="replace")
            if text not in seen:
                seen.add(text)
                _parses([text])
            # as the unterminated last line of a log (a process killed mid-write): every 8th cut
            parsed = _parses([whole, text]) if cut % 8 == 0 and step_line else None
            n += 1
            if parsed is not None and cut < len(raw):
                # a cut last line of a log that otherwise ends its lines is never a fatal damaged line
                assert not [s for s in parsed.fatal_sentinels if s.kind == "malformed_step_line"]
    COUNTS["truncations"] = n
    print(f"fuzz: {n} truncations of {len(LINES)} line shapes ({len(seen)} distinct alone)")


def _numbers(line: str) -> Iterable[re.Match[str]]:
    return list(_NUMBER.finditer(line))


def _finite(value: object) -> bool:
    return bool(pd.notna(value)) and math.isfinite(float(value))  # type: ignore[arg-type]


def _bad_values(parsed: ParsedLog, clean: ParsedLog) -> list[str]:
    """Loss / grad-norm columns that are finite in `clean` and not in `parsed` (same step)."""
    out = []
    for column in parsed.frame.columns:
        if not (is_loss(column) or column == "grad_norm") or column not in clean.frame.columns:
            continue
        for step in parsed.frame.index.intersection(clean.frame.index):
            value, before = parsed.frame.loc[step, column], clean.frame.loc[step, column]
            if _finite(before) and not _finite(value):
                out.append(column)
    return out


@pytest.mark.slow  # exhaustive: tens of thousands of parses (make test runs it)
def test_nan_and_inf_in_every_numeric_field() -> None:
    n = 0
    for line in STEP_LINES:
        clean = _parses([line])
        assert clean is not None
        for m in _numbers(line):
            for bad in ("nan", "inf", "-1e999"):
                text = line[:m.start()] + bad + line[m.end():]
                parsed = _parses([text])
                n += 1
                if parsed is None or len(parsed.frame) != 1:
                    continue
                if _bad_values(parsed, clean):  # a loss or grad norm made non-finite: the run is invalid
                    assert parsed.fatal_sentinels, (text, parsed.sentinels)
    COUNTS["non_finite"] = n
    print(f"fuzz: {n} non-finite substitutions")


def _fields(line: str) -> tuple[str, list[str], str] | None:
    """(head, fields, tail) of a step line whose fields may be reordered without changing what it says."""
    megatron = re.search(r"iteration\s+\d+/\s*\d+\s*\|", line)
    if megatron and "Training epoch" not in line:
        body = line[megatron.end():]
        parts = body.split("|")
        return line[:megatron.end()], parts[:-1], "|" + parts[-1]
    nemo = re.search(r"Training epoch \d+, iteration \d+/\d+", line)
    if nemo:
        return line[:nemo.end()], line[nemo.end():].split(" | ")[1:], ""
    pynative = re.search(r"\{ step:\[\s*\d+/\s*\d+\], ", line)
    if pynative and "N/A" not in line and line.rstrip().endswith("}"):
        body = line[pynative.end():].rstrip()[:-1].rstrip()
        return line[:pynative.end()], body.split(", "), " }"
    return None


REORDERABLE = [line for line in STEP_LINES if _fields(line) is not None]


def _same(a: ParsedLog | None, b: ParsedLog | None) -> None:
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        pd.testing.assert_frame_equal(a.frame, b.frame, check_like=True)
        assert [(s.kind, s.fatal) for s in a.sentinels] == [(s.kind, s.fatal) for s in b.sentinels]


@SETTINGS
@given(st.sampled_from(REORDERABLE), st.randoms(use_true_random=False))
def test_random_field_order_reads_the_same_values(line: str, rng: object) -> None:
    split = _fields(line)
    assert split is not None
    head, fields, tail = split
    shuffled = list(fields)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    sep = "|" if "|" in tail else (" | " if not tail else ", ")
    text = head + (" | " if sep == " | " else "") + sep.join(shuffled) + tail
    _same(_parses([text]), _parses([line]))


_ANSI = st.sampled_from(["\x1b[0m", "\x1b[32m", "\x1b[1;31m", "\x1b[2K", "\x1b[38;5;208m", "\x1bM"])


@SETTINGS
@given(st.sampled_from(LINES), st.lists(st.tuples(st.floats(0, 1), _ANSI), max_size=6))
def test_ansi_colour_codes_change_nothing(line: str, codes: list[tuple[float, str]]) -> None:
    text = line
    for where, code in sorted(codes, reverse=True):  # positions in the original line, inserted from the end
        at = int(where * len(line))
        text = text[:at] + code + text[at:]
    _same(_parses([text]), _parses([line]))


def test_crlf_line_ends_change_nothing() -> None:
    for path in sorted([*DATA.glob("*.log"), *DATA.glob("wild/*.log")]):
        lf = path.read_text(encoding="utf-8").splitlines(keepends=True)
        _same(_parses([x.replace("\n", "\r\n") for x in lf]), _parses(lf))


@settings(SETTINGS, max_examples=50)
@given(st.lists(st.sampled_from(LINES), min_size=1, max_size=12), st.lists(st.sampled_from(LINES), max_size=12))
def test_mixed_logs_parse_or_are_refused_and_compare_never_raises(a: list[str], b: list[str]) -> None:
    test, ref = _parses(a), _parses(b or a)
    if test is not None and ref is not None:
        result = compare(test, ref, default_criteria())
        json.dumps(result.to_json(), allow_nan=True)


def _megabyte_lines(line: str) -> list[str]:
    middle = len(line) // 2
    return [
        (line + " ") * (MB // (len(line) + 1) + 1),  # the line repeated to 1 MB
        line[:middle] + line[middle] * MB + line[middle:],  # one of its characters repeated 1 MB times inside
        line[:middle] + "x" * MB + line[middle:],
    ]


@pytest.mark.slow  # exhaustive: tens of thousands of parses (make test runs it)
def test_one_megabyte_lines() -> None:
    n = 0
    for i, line in enumerate(STEP_LINES):
        long = _megabyte_lines(line)[i % 3]
        _parses([long])
        parsed = _parses([line, long, line.replace("1", "2", 1)])
        n += 1
        assert parsed is None or parsed.frame.index.is_unique
    COUNTS["megabyte"] = n
    print(f"fuzz: {n} lines of 1 MB")


@pytest.mark.integration  # real processes
def test_the_cli_exits_0_or_2_on_fuzzed_logs(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """A real process on logs made of mutated lines: exit 0 (parsed) or 2 (refused, naming the file), no traceback."""
    logs = []
    for i, line in enumerate(STEP_LINES):
        raw = line.encode("utf-8")
        mutated = [raw[: len(raw) * k // 4].decode("utf-8", errors="replace") for k in (1, 2, 3)]
        body = [f"\x1b[32m{line}\x1b[0m\r\n", *(m + "\n" for m in mutated), line.replace(" ", "  ") + "\n"]
        if i % 10 == 0:
            body.append(line[: len(line) // 2] + "|" * MB + "\n")
        path = tmp_path / f"fuzz_{i}.log"
        path.write_text("".join(body), encoding="utf-8", newline="")
        logs.append(path)
    # One real process reads a quarter of them (the first as the reference, the others as its test logs): a
    # refusal names its file; otherwise every log was read (its sentinel summary line is printed).
    chosen = logs[:: len(logs) // 4]
    done = subprocess.run([sys.executable, "-m", "alignflow", "compare", *map(str, chosen), "--no-plots"],
                          env=subprocess_env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1, 2), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    if done.returncode == 2:
        assert any(f"error: {path}" in done.stderr for path in chosen), done.stderr
    else:
        assert all(f"{path.stem}: " in done.stdout for path in chosen), done.stdout
    from typer.testing import CliRunner

    from alignflow.cli import app

    runner = CliRunner()
    for path in logs:
        result = runner.invoke(app, ["logs", "parse", str(path), "--json"])
        assert result.exit_code in (0, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    COUNTS["cli"] = len(logs) + len(chosen)
    print(f"fuzz: {len(logs)} fuzzed logs through `logs parse`, {len(chosen)} through one `compare` (real process)")
    print(f"fuzz: {COUNTS.get('parses', 0)} parse_log calls in this module so far")


# ---- logs as people paste them (issue 33): glued tails, delimiters, wrapped lines, 0-based counters, timestamps

# The unit tier's budget: 40 examples a property (derandomized, so the same 40 every run); `make test` too.
PASTED = settings(SETTINGS, max_examples=40)
MEGATRON_LINES = [line for line in STEP_LINES if (p := _parses([line])) is not None and p.fmt == "megatron"
                  and p.variant == "megatron"]
# Real non-step output of the frameworks (the fixtures' other lines): what another process glues onto a line.
OTHER_LINES = [line for line in LINES if line.strip() and not any(spec.is_step_line(line) for spec in FORMATS.values())]


def _values(parsed: ParsedLog | None) -> dict[str, object]:
    assert parsed is not None
    assert len(parsed.frame) == 1
    return {k: v for k, v in parsed.frame.iloc[0].items() if pd.notna(v)}


def _fatal(parsed: ParsedLog | None) -> set[str]:
    return set() if parsed is None else {s.kind for s in parsed.fatal_sentinels}


def test_the_fixtures_hold_megatron_lines_and_other_output() -> None:
    assert len(MEGATRON_LINES) >= 10
    assert len(OTHER_LINES) >= 20


@PASTED
@given(st.sampled_from(MEGATRON_LINES), st.sampled_from(OTHER_LINES), st.sampled_from(["", " ", "  "]))
def test_text_glued_after_the_last_field_keeps_every_value(line: str, other: str, sep: str) -> None:
    """Another process's output glued onto a step line: every field reads as before; a fatal verdict only when
    the glued text is itself a fatal line (it is scanned as one)."""
    clean = _parses([line])
    parsed = _parses([line + sep + other])
    assert _values(parsed) == _values(clean)
    assert _fatal(parsed) <= _fatal(_parses([line, other])) | _fatal(clean)


_WRAPPERS = st.sampled_from([("", ""), ("(", ")"), ('"', '"'), ("'", "',"), ("> ", ""), ("`", "`"), ("[", "]")])


@PASTED
@given(st.sampled_from(MEGATRON_LINES), _WRAPPERS, st.booleans(), st.integers(0, 3), st.randoms(use_true_random=False))
def test_missing_and_extra_delimiters_and_wrappers_change_no_value(line: str, wrapper: tuple[str, str],
                                                                   drop_last: bool, extra: int, rng: object) -> None:
    clean = _parses([line])
    text = line.rstrip()
    if drop_last:
        text = text.rstrip("|").rstrip()
    bars = [i for i, c in enumerate(text) if c == "|"]
    for at in sorted(rng.sample(bars, min(extra, len(bars))), reverse=True):  # type: ignore[attr-defined]
        text = text[:at] + "| |"[: rng.choice([2, 3])] + text[at + 1:]  # type: ignore[attr-defined]
    parsed = _parses([wrapper[0] + text + wrapper[1]])
    assert _values(parsed) == _values(clean)
    assert _fatal(parsed) == _fatal(clean)


@PASTED
@given(st.sampled_from(MEGATRON_LINES), st.floats(0, 1), st.booleans())
def test_a_line_wrapped_anywhere_after_its_anchor_reads_as_one(line: str, where: float, eat_space: bool) -> None:
    """A document wrapped a step line in two at any character after `iteration N/M |` (eating the space it broke
    at, or not): the two physical lines read as the one line, between two other step lines."""
    clean = _parses([line])
    text = line.rstrip()
    first = text.index("|") + 1
    at = first + int(where * (len(text) - first))
    head, tail = text[:at], text[at:]
    if eat_space and tail.startswith(" "):
        tail = tail[1:]
    before, after = _renumbered(line, -1), _renumbered(line, +1)
    parsed = _parses([before + "\n", head + "\n", tail + "\n", after + "\n"])
    assert parsed is not None
    step = int(re.search(r"iteration\s+(\d+)", line).group(1))  # type: ignore[union-attr]
    row = {k: v for k, v in parsed.frame.loc[step].items() if pd.notna(v)}
    assert row == _values(clean)
    assert _fatal(parsed) <= _fatal(_parses([before + "\n", line, after + "\n"]))


def _renumbered(line: str, delta: int) -> str:
    return re.sub(r"iteration(\s+)(\d+)/", lambda m: f"iteration{m.group(1)}{int(m.group(2)) + delta + 1}/", line,
                  count=1) if delta >= 0 else re.sub(r"iteration(\s+)(\d+)/",
                                                     lambda m: f"iteration{m.group(1)}{max(int(m.group(2)) - 1, 0)}/",
                                                     line, count=1)


@PASTED
@given(st.integers(1, 4), st.integers(2, 30), st.integers(1, 7), st.booleans(), st.booleans())
def test_epoch_counters_from_zero_or_one_number_the_same_steps(epochs: int, per_epoch: int, every: int,
                                                               zero_based: bool, capital: bool) -> None:
    """MindSpore model-zoo monitors (`epoch: [{:3d}/{:3d}], step:[{:5d}/{:5d}], loss:[..]`) print `cur_epoch_num - 1`
    and the step in the epoch from 0, or both from 1; MindFormers 0.6 prints `Epoch:[%3d/%3d], step:[%5d/%5d]`
    from 1. Whatever the base and the print interval, a log from the start numbers its steps 1..N, none negative,
    and a complete run is no incomplete_run."""
    lines, want = [], []
    for g in range(1, epochs * per_epoch + 1):
        if g % every and g != epochs * per_epoch:
            continue
        epoch, step = (g - 1) // per_epoch + (0 if zero_based else 1), (g - 1) % per_epoch + (0 if zero_based else 1)
        head = f"Epoch:[{epoch:3d}/{epochs:3d}], step:[{step:5d}/{per_epoch:5d}]" if capital else \
            f"epoch: [{epoch:3d}/{epochs:3d}], step:[{step:5d}/{per_epoch:5d}]"
        lines.append(f"{head}, loss:[{2.0:5.3f}/{2.0:5.3f}], time:[{1.5:5.3f}], lr:[{0.1:5.3f}]\n")
        want.append(g)
    parsed = _parses(lines)
    assert parsed is not None
    evidence = zero_based and (any(((g - 1) // per_epoch) == 0 for g in want))
    if evidence or not zero_based:
        assert parsed.steps == want
    assert min(parsed.steps) >= 1
    if parsed.steps == want:
        assert "incomplete_run" not in {s.kind for s in parsed.sentinels}


# Every timestamp style before `iteration` that the frameworks and the tools around them print: megatron-core's own
# (` [%Y-%m-%d %H:%M:%S]` before 0.16, ` [%Y-%m-%d %H:%M:%S.%f]` since), RFC 3339 as forks and collectors write it
# (`datetime.isoformat`, `date --rfc-3339`, `kubectl logs --timestamps`' RFC3339Nano, `Z` or an offset).
_STAMPS = st.sampled_from([
    (" [2025-10-21 16:18:53]", False), (" [2025-10-21 16:18:53.123456]", True),
    ("[2025-10-21T16:18:53+08:00]", False), ("[2025-10-21T16:18:53.123+08:00]", True),
    ("[2025-10-21T08:18:53Z]", False), ("2025-10-21T08:18:53.123456789Z", True), ("[2025-10-21 16:18:53+08:00]", False),
    ("[2025-10-21T16:18:53+0800]", False), ("[ 2025-10-21T16:18:53.5-05:00 ]", True),
])


@PASTED
@given(st.sampled_from(MEGATRON_LINES), _STAMPS)
def test_every_timestamp_style_is_a_timestamp_of_its_precision(line: str, stamp: tuple[str, bool]) -> None:
    text, sub_second = stamp
    bare = re.sub(r"^.*?(?=iteration\s)", "", line.rstrip())
    first = re.sub(r"iteration(\s+)\d+/", lambda m: f"iteration{m.group(1)}1/", bare, count=1)
    second = re.sub(r"iteration(\s+)\d+/", lambda m: f"iteration{m.group(1)}2/", bare, count=1)
    parsed = _parses([text + " " + first + "\n", text + " " + second + "\n"])
    assert parsed is not None
    assert _values(_parses([text + " " + first])) == _values(_parses([first]))
    note = parsed.first_interval
    assert note is not None
    (interval,) = note.intervals
    assert ("microsecond timestamps" if sub_second else "seconds-only timestamps") in interval.reason
