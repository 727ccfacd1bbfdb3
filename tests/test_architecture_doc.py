"""docs/architecture.md's pipeline diagram and code layout cannot drift from the code (issue 34).

The diagram (the first code block under "## The pipeline") names every step of the embedded default's pipeline
(`alignflow/pipeline.py`), numbered in their order, and no other; the layout (the code block under "## Layout")
lists exactly the packages under `alignflow/` (a directory with an `__init__.py`, nested ones indented under their
parent) and names every module of `alignflow/` itself.
"""

from __future__ import annotations

import re
from pathlib import Path

from alignflow import pipeline

ENTRY = re.compile(r"^(?P<indent> *)(?P<names>[\w.]+/?(?:, [\w.]+/?)*)(?:\s+|$)")


def drawn_pipeline() -> tuple[str, ...]:
    """The steps of the pipeline the diagram draws: the classic one, the embedded default's (`pipeline.DEFAULT`;
    another experiment's is derived from its checkpoint formats)."""
    return pipeline.DEFAULT.names


def section_block(page: str, heading: str) -> list[str]:
    """The lines of the first fenced block after `heading`."""
    lines = page.splitlines()
    start = lines.index(heading)
    opening = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return lines[opening + 1:closing]


def diagram_steps(block: list[str]) -> list[tuple[int, str]]:
    """The numbered steps a diagram names (`3 convert_megatron`), by number."""
    step = re.compile(r"\b(\d+) ([a-z][a-z0-9_]+)")
    return sorted((int(m.group(1)), m.group(2)) for line in block for m in step.finditer(line))


def layout_entries(block: list[str]) -> tuple[set[str], set[str]]:
    """The packages (`labs/mindformers_cpu`) and the modules of `alignflow/` itself (`pipeline.py`) the layout
    lists under `alignflow/`."""
    packages: set[str] = set()
    modules: set[str] = set()
    inside, parent = False, ""
    for line in block:
        entry = ENTRY.match(line)
        if entry is None:
            continue
        indent = len(entry["indent"])
        if indent == 0:
            inside = entry["names"] == "alignflow/"
            continue
        if not inside or indent > 4:  # a description's continuation
            continue
        for name in entry["names"].split(", "):
            if name.endswith("/"):
                path = name.rstrip("/") if indent == 2 else f"{parent}/{name.rstrip('/')}"
                packages.add(path)
                if indent == 2:
                    parent = path
            elif indent == 2:
                modules.add(name)
    return packages, modules


def test_the_pipeline_diagram_draws_exactly_the_declared_steps_in_order(repo_root: Path) -> None:
    page = (repo_root / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawn = diagram_steps(section_block(page, "## The pipeline"))
    assert drawn == list(enumerate(drawn_pipeline(), start=1)), (
        f"the diagram numbers {drawn}; alignflow/pipeline.py declares {list(drawn_pipeline())}")


def test_the_layout_lists_exactly_the_packages_and_names_every_module(repo_root: Path) -> None:
    page = (repo_root / "docs" / "architecture.md").read_text(encoding="utf-8")
    packages, modules = layout_entries(section_block(page, "## Layout"))
    code = repo_root / "alignflow"
    real_packages = {p.parent.relative_to(code).as_posix() for p in code.rglob("__init__.py") if p.parent != code}
    real_modules = {p.name for p in code.glob("*.py")}
    assert packages == real_packages, (f"listed, not a package: {sorted(packages - real_packages)}; "
                                       f"a package not listed: {sorted(real_packages - packages)}")
    assert modules == real_modules, (f"listed, not a module: {sorted(modules - real_modules)}; "
                                     f"a module not listed: {sorted(real_modules - modules)}")


def test_the_layout_parser_reads_entries_and_skips_descriptions() -> None:
    block = ["pyproject.toml        the project", "alignflow/            the core", "  config/             models",
             "                      continued: not/ an entry.py", "  labs/               labs",
             "    mindformers_cpu/  a lab", "  state.py, errors.py the state dir", "tasks/                tasks"]
    assert layout_entries(block) == ({"config", "labs", "labs/mindformers_cpu"}, {"state.py", "errors.py"})
    assert diagram_steps([" 1 npu_base_train --base ckpt--> 2 convert_bf16", " 3 xx --> 10 yy"]) == [
        (1, "npu_base_train"), (2, "convert_bf16"), (3, "xx"), (10, "yy")]
