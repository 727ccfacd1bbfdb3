"""The command blocks of the documentation that the journeys run, and the sample outputs they check.

A block runs when an HTML comment (invisible on GitHub) right above its fence names it:

    <!-- journey: NAME [PLACEHOLDER ...] -->
    ```bash
    alignflow server start        # comments stay: bash ignores them
    alignflow ui RUN
    ```

- NAME: the journey step that runs it (`tests/journeys/`); a name is used once across all the files.
- PLACEHOLDER: an upper-case word of the block that the reader replaces, and the journey with what an earlier
  command printed (`RUN`: the run id `alignflow run` printed). Nothing else is substituted: every line runs as
  written, with bash, in the journey's checkout.

    <!-- journey-output: NAME -->
    ```
    run 5622de9be3ae of demo: completed, verdict PASS
    ```

marks a sample of what journey step NAME prints; the journey checks it against the real output (`sample_matches`).

Every marked block must be one a journey runs (`tests/journeys/test_walk.py` checks the names), so a block cannot be
marked and forgotten, nor a journey left running a block the docs no longer show. `documents()` lists the files:
the README and every page under docs/, so new guide pages only need their blocks marked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!--\s*journey(?P<output>-output)?:\s*(?P<name>[\w-]+)(?P<words>(?:\s+[A-Z][A-Z0-9_]*)*)"
                    r"\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w-]*)\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """A marked fenced block: its lines (without the fences), where it is, and its placeholders."""

    name: str
    kind: str  # "commands" | "output"
    lines: tuple[str, ...]
    path: Path
    line: int  # of the marker (1-based)
    placeholders: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def commands(self) -> tuple[str, ...]:
        """The block's commands: every line that is not blank or a whole-line comment."""
        return tuple(line for line in self.lines if line.strip() and not line.lstrip().startswith("#"))

    def command(self, index: int, values: Mapping[str, str]) -> str:
        """Command `index` with its placeholders replaced (whole words) by `values`."""
        text = self.commands[index]
        for word in self.placeholders:
            if re.search(rf"\b{word}\b", text):
                assert word in values, f"{self.where}: {word} has no value yet (the journey learns it earlier)"
                text = re.sub(rf"\b{word}\b", values[word], text)
        return text


def documents(repo: Path) -> list[Path]:
    """The markdown files whose marked blocks the journeys run: the README and docs/**."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def marked_blocks(paths: Iterable[Path]) -> dict[str, Block]:
    """Every marked block of `paths`, by name; a marker not followed by a fence, an unclosed fence or a name used
    twice is an error naming the file and line."""
    found: dict[str, Block] = {}
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, text in enumerate(lines, start=1):
            marker = MARKER.match(text.strip())
            if marker is None:
                continue
            opening = FENCE.match(lines[number].strip()) if number < len(lines) else None
            if opening is None:
                raise ValueError(f"{path.name}:{number}: a journey marker must be right above a ``` fence")
            end = next((i for i in range(number + 1, len(lines)) if lines[i].strip() == opening["fence"]), None)
            if end is None:
                raise ValueError(f"{path.name}:{number + 1}: the fence is never closed")
            name = marker["name"]
            if name in found:
                raise ValueError(f"{path.name}:{number}: journey block {name!r} is also at {found[name].where}")
            found[name] = Block(name, "output" if marker["output"] else "commands", tuple(lines[number + 1:end]),
                                path, number, tuple(marker["words"].split()))
    return found


# --- sample outputs -------------------------------------------------------------------------------------------
_TABLE_CHARS = str.maketrans({c: " " for c in "┏┓┗┛┃━┡┩╇┳┻│─└┘┴┬├┤┼┌┐╭╮╰╯"})
_VARYING = [
    (re.compile(r"https?://\S+"), "<url>"),
    (re.compile(r"\S*/\S+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{8,64}\b"), "<id>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\b"), "<time>"),
    (re.compile(r"\b(\d+h)?(\d+m)?\d+s\b"), "<duration>"),
    (re.compile(r"\b(\d+ h )?(\d+ min )?\d+(\.\d+)? s\b"), "<duration>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?(?!\w)"), "<n>"),
]


def skeleton(line: str) -> str:
    """A line without what differs between two runs (ids, numbers, paths, URLs, times) or table borders."""
    text = line.translate(_TABLE_CHARS)
    for pattern, stand_in in _VARYING:
        text = pattern.sub(stand_in, text)
    return " ".join(text.split())


def table_rows(lines: Iterable[str]) -> list[tuple[str, str]]:
    """The (first, second) cells, as skeletons, of a rich table's body rows that start a row (the first cell is not
    blank; a table's other cells wrap with the terminal's width)."""
    rows = []
    for line in lines:
        if not line.startswith("│"):
            continue
        cells = [skeleton(c) for c in line.strip("│").split("│")]
        if len(cells) >= 2 and cells[0]:
            rows.append((cells[0], cells[1]))
    return rows


def _in_order(wanted: list[Any], have: list[Any]) -> list[Any]:
    """The items of `wanted` that `have` lacks, each looked for after the previous one found."""
    missing, position = [], 0
    for want in wanted:
        hit = next((i for i in range(position, len(have)) if have[i] == want), None)
        if hit is None:
            missing.append(want)
        else:
            position = hit + 1
    return missing


def _stream(lines: Iterable[str]) -> list[str]:
    """The words of every line outside a table body, as skeletons, in order (a long line wraps where the terminal
    ends: as a stream of words, a sample printed at another width, or with a longer path, still reads the same)."""
    return [word for line in lines if not line.startswith("│") for word in skeleton(line).split()]


def _find(words: list[str], stream: list[str], start: int) -> int | None:
    """Where `words` occur contiguously in `stream` at or after `start` (the index after them), or None."""
    for i in range(start, len(stream) - len(words) + 1):
        if stream[i:i + len(words)] == words:
            return i + len(words)
    return None


def sample_matches(sample: Block, output: str) -> list[str]:
    """What of the sample the output lacks (empty when it matches), in the sample's order: every line outside a
    table body (as a skeleton, wherever the output wrapped it), and the first two cells of each table row. A line
    `…` stands for lines left out."""
    out_lines = output.splitlines()
    kept = [line for line in sample.lines if line.strip() not in ("…", "...")]
    stream, position, problems = _stream(out_lines), 0, []
    for line in kept:
        words = _stream([line])
        if not words:
            continue
        found = _find(words, stream, position)
        if found is None:
            problems.append(f"{sample.where}: no line like {' '.join(words)!r}")
        else:
            position = found
    rows = _in_order(table_rows(kept), table_rows(out_lines))
    return problems + [f"{sample.where}: no table row starting {cells}" for cells in rows]
