"""Verbatim lines from the MindFormers and Megatron references parse to the values they print.

The expected values in tests/data/logs/*.json were typed from the lines themselves, not produced by the parser.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from alignflow.errors import LogParseError
from alignflow.logs import Resolution, parse_log

DATA = Path(__file__).resolve().parent.parent / "data" / "logs"


def _cases(name: str) -> list[Any]:
    cases = json.loads((DATA / name).read_text(encoding="utf-8"))
    return [pytest.param(c, id=c["name"]) for c in cases]


@pytest.mark.parametrize("case", _cases("mindformers_lines.json") + _cases("megatron_lines.json")
                         + _cases("nemo_lines.json"))
def test_reference_line_parses_to_its_printed_values(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(LogParseError, match=case["error"]):
            parse_log([case["line"]], source="golden")
        return
    parsed = parse_log([case["line"]], source="golden")
    assert parsed.steps == [case["step"]]
    assert parsed.max_steps == case["max_steps"]
    assert parsed.variant == case["variant"]
    assert parsed.rank == case.get("rank")
    row = parsed.frame.loc[case["step"]]
    for column, expected in case["values"].items():
        assert column in parsed.frame.columns, f"{column} missing; columns: {parsed.columns}"
        assert math.isclose(float(row[column]), expected, rel_tol=1e-15, abs_tol=1e-12), column
    for column in case.get("absent", []):
        assert column not in parsed.frame.columns
    for column, (kind, digits) in case.get("resolution", {}).items():
        assert parsed.resolution[column] == Resolution(kind, digits), column
    found = [(s.kind, s.fatal) for s in parsed.sentinels if s.kind != "incomplete_run"]
    assert found == [tuple(x) for x in case.get("sentinels", [])]
