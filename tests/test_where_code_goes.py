"""docs/architecture.md#where-code-goes stays true: the files it names exist, and the registries it calls closed are
the only product modules that list their names (no `Literal`, enum, CLI choice or constant tuple repeats them)."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from alignflow.config.statistics import STATISTICS
from alignflow.logs.formats import FORMATS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PRODUCT = ("alignflow", "flows", "tasks")


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("\n## Where code goes\n")
    return text[start:text.index("\n## ", start + 1)]


def _rows() -> dict[str, list[str]]:
    """Each table row's extension point -> the paths its cells name."""
    rows: dict[str, list[str]] = {}
    for line in _section().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("extension point", "---"):
            rows[cells[0]] = re.findall(r"`((?:alignflow|tests|flows|tasks)/[^`]*)`", " ".join(cells))
    return rows


def test_the_page_names_every_extension_point_and_files_that_exist() -> None:
    rows = _rows()
    assert set(rows) == {"log format", "statistic", "transport", "side backend", "checkpoint format"}
    missing = [path for paths in rows.values() for path in paths if "<" not in path and not (ROOT / path).exists()]
    assert missing == [], f"docs/architecture.md#where-code-goes names files that do not exist: {missing}"
    templates = [path for paths in rows.values() for path in paths if "<" in path]
    assert all((ROOT / path).parent.is_dir() for path in templates), templates


def _listed(tree: ast.Module) -> Iterator[tuple[int, set[str]]]:
    """String sets a module spells out as choices: a `Literal[...]`, a module-level tuple/list/set/frozenset/dict
    constant, the string members of a class body (an enum)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
            yield node.lineno, {n.value for n in ast.walk(node.slice) if isinstance(n, ast.Constant)
                                and isinstance(n.value, str)}
        elif isinstance(node, ast.ClassDef):
            yield node.lineno, {s.value.value for s in node.body if isinstance(s, ast.Assign)
                                and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)}
    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and value.args:  # frozenset({...}), set(...)
            value = value.args[0]
        if isinstance(value, ast.Dict):
            yield stmt.lineno, {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(value, ast.Tuple | ast.List | ast.Set):
            yield stmt.lineno, {e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


@functools.cache
def _product_trees() -> tuple[tuple[str, ast.Module], ...]:
    """Every product module's path and syntax tree, parsed once for the tests of this page."""
    return tuple((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
                 for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py")))


REGISTRIES = {
    # a registry's names, where they may be listed, and how many of them make a list of its choices
    "log formats": (set(FORMATS), "alignflow/logs/formats.py", len(FORMATS)),
    "statistics": (set(STATISTICS), "alignflow/config/statistics.py", 2),
}


@pytest.mark.parametrize("what", list(REGISTRIES))
def test_only_the_registry_lists_its_names(what: str) -> None:
    names, home, enough = REGISTRIES[what]
    found = []
    for rel, tree in _product_trees():
        if rel == home or "migrations" in rel:
            continue
        for line, listed in _listed(tree):
            if len(listed & names) >= enough:
                found.append(f"{rel}:{line}: {sorted(listed & names)}")
    assert found == [], f"{what} listed outside their registry ({home}); read them from it instead: {found}"


def test_no_product_module_branches_on_a_statistics_name() -> None:
    """`if c.statistic == "step_rel"` / `elif stat == "me"`: what a statistic does is in its registry entry."""
    found = []
    for rel, tree in _product_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                    isinstance(n, ast.Constant) and n.value in STATISTICS for n in node.comparators) and \
                    "stat" in ast.unparse(node.left):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], f"branches on a statistic's name (give the Statistic a field instead): {found}"
