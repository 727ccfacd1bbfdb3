"""The marker convention of the documentation's runnable blocks (tests/journeys/markdown.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.journeys.markdown import documents, marked_blocks, sample_matches

GUIDE = """\
# Guide

```bash
alignflow run --help        # not marked: never run
```

<!-- journey: walk RUN -->
```bash
# a whole-line comment is not a command
alignflow server start      # keep one
alignflow ui RUN
```

<!-- journey-output: walk-output -->
```
run 0123456789ab of demo: completed, verdict PASS
┏━━━━━━━━━━━━━━━━┳━━━━━━━━┓
┃ step           ┃ status ┃
┡━━━━━━━━━━━━━━━━╇━━━━━━━━┩
│ npu_base_train │ ran    │
│ convert_bf16   │ ran    │
└────────────────┴────────┘
…
report:  /home/me/.alignflow/reports/0123456789ab-2e9efc/report.html
time:    61.2 s
```
"""

OUTPUT = """\
run fedcba987654 of demo: completed, verdict PASS
  trigger cli · started 2026-12-06 05:50:36 · took 44.3 s · alignflow 0.1.0
steps
┏━━━━━━━━━━━━━━━━━━┳━━━━━━━━┓
┃ step             ┃ status ┃
┡━━━━━━━━━━━━━━━━━━╇━━━━━━━━┩
│ npu_base_train   │ ran    │
│                  │        │
│ convert_bf16     │ ran    │
└──────────────────┴────────┘
report:  /tmp/x/.alignflow/reports/fedcba987654-f9fafc/report.html
time:    49.4 s
"""


@pytest.fixture
def guide(tmp_path: Path) -> Path:
    path = tmp_path / "guide.md"
    path.write_text(GUIDE, encoding="utf-8")
    return path


def test_a_marked_block_runs_its_commands_with_the_placeholders_filled(guide: Path) -> None:
    blocks = marked_blocks([guide])
    assert set(blocks) == {"walk", "walk-output"}
    walk = blocks["walk"]
    assert (walk.kind, walk.where, walk.placeholders) == ("commands", "guide.md:7", ("RUN",))
    assert walk.commands == ("alignflow server start      # keep one", "alignflow ui RUN")
    assert walk.command(1, {"RUN": "0123456789ab"}) == "alignflow ui 0123456789ab"
    with pytest.raises(AssertionError, match="RUN has no value yet"):
        walk.command(1, {})


def test_a_sample_output_matches_another_runs_output_and_not_a_different_one(guide: Path) -> None:
    sample = marked_blocks([guide])["walk-output"]
    assert sample_matches(sample, OUTPUT) == []
    wrapped = OUTPUT.replace("report:  /tmp/x", "report:\n/tmp/x")  # a narrower terminal, or a longer path
    assert sample_matches(sample, wrapped) == []
    failed = OUTPUT.replace("│ convert_bf16     │ ran    │", "│ convert_bf16     │ failed │")
    assert sample_matches(sample, failed) == ["guide.md:14: no table row starting ('convert_bf16', 'ran')"]
    assert sample_matches(sample, OUTPUT.replace("verdict PASS", "verdict FAIL")) == [
        "guide.md:14: no line like 'run <id> of demo: completed, verdict PASS'"]


def test_misplaced_markers_and_names_used_twice_are_refused_with_file_and_line(tmp_path: Path) -> None:
    lonely = tmp_path / "lonely.md"
    lonely.write_text("<!-- journey: walk -->\n\nalignflow run\n")
    with pytest.raises(ValueError, match=r"lonely.md:1: a journey marker must be right above a ``` fence"):
        marked_blocks([lonely])
    twice = tmp_path / "twice.md"
    twice.write_text("<!-- journey: walk -->\n```bash\na\n```\n<!-- journey: walk -->\n```bash\nb\n```\n")
    with pytest.raises(ValueError, match=r"twice.md:5: journey block 'walk' is also at twice.md:1"):
        marked_blocks([twice])


def test_the_files_are_the_readme_and_every_page_under_docs(repo_root: Path) -> None:
    files = documents(repo_root)
    assert files[0] == repo_root / "README.md"
    assert all(f.suffix == ".md" and repo_root / "docs" in f.parents for f in files[1:])
