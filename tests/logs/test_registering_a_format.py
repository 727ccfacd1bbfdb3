"""A new log format is one registry entry: registered here, in the test, it is detected and read by `parse_log`, its
sentinels fire, `alignflow logs parse --format` and `alignflow compare` take its name, and a `command` side may
declare it - no product file names it (docs/architecture.md#where-code-goes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from alignflow.backends.command import CommandLog
from alignflow.cli import app
from alignflow.logs import formats, parse_log
from alignflow.logs.formats import LogFormatSpec
from alignflow.logs.lines import StepLine
from alignflow.logs.sentinels import LineRule, Marker

_STEP = re.compile(r"^<tiny> step (\d+)/(\d+) loss=(\S+) gnorm=(\S+)$")


def _parse_step(text: str, with_resolution: bool) -> StepLine | str | None:
    m = _STEP.match(text)
    if m is None:
        return None
    rec = StepLine(step=int(m.group(1)), values={"lm_loss": float(m.group(3)), "grad_norm": float(m.group(4))},
                   variant="tiny", max_steps=int(m.group(2)))
    if with_resolution:
        rec.set_resolution("lm_loss", m.group(3))
        rec.set_resolution("grad_norm", m.group(4))
    return rec


TINY = LogFormatSpec(
    name="tiny", label="Tiny", title="a trainer that prints `<tiny> step N/M loss=L gnorm=G`",
    is_step_line=lambda text: text.startswith("<tiny> step "), parse_step=_parse_step,
    rules=(LineRule(kind="tiny_overflow", needle="<tiny> overflow", fatal=True, message="the loss scale overflowed"),),
    markers=(Marker(name="tiny_loaded", needle="<tiny> loaded weights"),),
    known_columns=frozenset({"lm_loss", "grad_norm"}), loss_columns=("lm_loss",), anchor="`<tiny> step N/M`",
)


def _log(*losses: float, extra: str = "") -> str:
    lines = ["<tiny> loaded weights"] + [f"<tiny> step {i}/{len(losses)} loss={v:.4f} gnorm=0.125"
                                          for i, v in enumerate(losses, 1)]
    return "\n".join(lines) + "\n" + extra


@pytest.fixture(autouse=True)
def _tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(formats.FORMATS, TINY.name, TINY)  # the one registry entry


def test_a_registered_format_is_detected_and_read_with_its_printed_resolution() -> None:
    parsed = parse_log(_log(2.5, 2.25).splitlines(keepends=True))
    assert parsed.fmt == "tiny"
    assert parsed.frame["lm_loss"].tolist() == [2.5, 2.25]
    assert (parsed.resolution["lm_loss"].kind, parsed.resolution["lm_loss"].digits) == ("decimals", 4)
    assert "tiny_loaded" in parsed.markers
    assert parse_log(_log(2.5).splitlines(), fmt="tiny").fmt == "tiny"


def test_its_sentinels_fire_and_its_name_is_offered_where_formats_are_named() -> None:
    parsed = parse_log(_log(2.5, extra="<tiny> overflow at step 2\n").splitlines())
    assert [s.kind for s in parsed.sentinels if s.fatal] == ["tiny_overflow"]
    assert "tiny" in formats.names()
    assert CommandLog(format="tiny").format == "tiny"
    with pytest.raises(ValidationError, match=r"unknown log format 'tinier'; registered: .*tiny"):
        CommandLog(format="tinier")


def test_the_cli_parses_and_compares_logs_of_the_registered_format(tmp_path: Path) -> None:
    ref, test = tmp_path / "ref.log", tmp_path / "test.log"
    ref.write_text(_log(2.5, 2.25, 2.0))
    test.write_text(_log(2.5, 2.25, 2.0))
    runner = CliRunner()
    parsed = runner.invoke(app, ["logs", "parse", "--format", "tiny", "--json", str(ref)])
    assert parsed.exit_code == 0, parsed.output
    compared = runner.invoke(app, ["compare", "--ref-format", "tiny", "--test-format", "tiny", str(ref), str(test),
                                   "--out", str(tmp_path / "report")])
    assert compared.exit_code == 0, compared.output
    refused = runner.invoke(app, ["logs", "parse", "--format", "tinier", str(ref)])
    assert refused.exit_code == 2
    assert "tiny" in " ".join(refused.output.split())  # among the registered formats it names
