"""The import graph of alignflow, flows and tasks: no cycles, and the layers import one way only.

    flows -> tasks -> alignflow's commands (cli) -> alignflow.runner
          -> the parts (backends, preflight, transport, store, convert, logs, compare, twin, ...)
          -> alignflow.config -> the foundation (errors, pipeline, state, regression, fingerprint, ...)

The graph is grimp's (https://grimp.readthedocs.io): it reads every `import` statement, those inside functions too
(an import deferred to break a cycle is still the cycle) and those under `if TYPE_CHECKING:` (never executed, but
a module that names another's types in its signatures depends on it: a circle through annotations is a circle;
six transport modules once formed one, issue 34). Third-party packages are not in the graph: a lazy import of a
heavy library is fine. No process is started; building the graph takes a few hundredths of a second.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from itertools import pairwise
from pathlib import Path

import grimp
import pytest

PACKAGES = ("alignflow", "flows", "tasks")
# Read by path (Alembic), never imported: not part of the import graph.
NOT_IMPORTED = ("alignflow/store/migrations",)

COMMANDS = ("alignflow.cli", "alignflow.__main__", "alignflow.step_render")
RUNNER = "alignflow.runner"
CONFIG = "alignflow.config"
FOUNDATION = ("alignflow.errors", "alignflow.pipeline", "alignflow.state", "alignflow.regression",
              "alignflow.fingerprint", "alignflow.controller", "alignflow.codeversion", "alignflow.lazy")


def _build(*packages: str) -> grimp.ImportGraph:
    return grimp.build_graph(*packages, cache_dir=None, exclude_type_checking_imports=False)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return _build(*PACKAGES)


def _edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    return {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}


def _unit(module: str) -> str:
    """The package a module belongs to: `alignflow.<part>` (a subpackage or a top-level module), flows, tasks."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "alignflow" and len(parts) > 1 else parts[0]


def _strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _cycle(edges: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first member, staying inside the component."""
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt in inside and nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def _hop(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    lines = sorted({d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)})
    return f"{importer}:{','.join(map(str, lines))}"


def _chain(graph: grimp.ImportGraph, modules: list[str]) -> str:
    return " -> ".join([*(_hop(graph, a, b) for a, b in pairwise(modules)), modules[-1]])


def test_every_source_directory_is_a_package_the_graph_sees(repo_root: Path, graph: grimp.ImportGraph) -> None:
    """A directory without __init__.py is a namespace package grimp does not walk: its imports would be unseen."""
    unseen = sorted(
        str(directory.relative_to(repo_root))
        for package in PACKAGES for directory in {p.parent for p in (repo_root / package).rglob("*.py")}
        if "__pycache__" not in directory.parts
        and not str(directory.relative_to(repo_root)).startswith(NOT_IMPORTED)
        and ".".join(directory.relative_to(repo_root).parts) not in graph.modules)
    assert unseen == [], f"directories with Python modules but no __init__.py: {unseen}"


def test_no_cycle_between_packages(graph: grimp.ImportGraph) -> None:
    units: dict[str, set[str]] = {}
    crossing: dict[tuple[str, str], list[str]] = {}
    for importer, imported_set in sorted(_edges(graph).items()):
        for imported in sorted(imported_set):
            a, b = _unit(importer), _unit(imported)
            if a != b:
                units.setdefault(a, set()).add(b)
                crossing.setdefault((a, b), []).append(_chain(graph, [importer, imported]))
    problems = []
    for component in _strongly_connected(units):
        hops = [chain for a in component for b in component for chain in crossing.get((a, b), [])]
        problems.append(f"{' -> '.join(_cycle(units, component))}, through:\n    " + "\n    ".join(hops))
    assert problems == [], "packages that import each other (module:line -> imported module):\n" + "\n".join(problems)


def test_no_cycle_between_modules(graph: grimp.ImportGraph) -> None:
    module_edges = _edges(graph)
    problems = [_chain(graph, _cycle(module_edges, component)) + f"  ({len(component)} modules: {component})"
                for component in _strongly_connected(module_edges)]
    assert problems == [], "modules that import each other (module:line -> ...):\n" + "\n".join(problems)


def _layers(graph: grimp.ImportGraph) -> list[grimp.Layer]:
    named = {*COMMANDS, RUNNER, CONFIG, *FOUNDATION}
    parts = sorted({_unit(m) for m in graph.modules if m.startswith("alignflow.")} - named)
    return [grimp.Layer("flows"), grimp.Layer("tasks"),
            grimp.Layer(*COMMANDS, independent=False),
            grimp.Layer(RUNNER),
            grimp.Layer(*parts, independent=False),
            grimp.Layer(CONFIG),
            grimp.Layer(*FOUNDATION, independent=False)]


def test_the_layers_import_downwards_only(graph: grimp.ImportGraph) -> None:
    layers = _layers(graph)
    missing = sorted(m for layer in layers for m in layer.module_tails if m not in graph.modules)
    assert missing == [], f"layers naming modules that do not exist (grimp would skip them): {missing}"
    assert {"alignflow.backends", "alignflow.preflight", "alignflow.transport", "alignflow.store",
            "alignflow.convert", "alignflow.logs", "alignflow.compare"} <= layers[4].module_tails
    problems = []
    for dependency in sorted(graph.find_illegal_dependencies_for_layers(layers=layers),
                             key=lambda d: (d.importer, d.imported)):
        for route in sorted(dependency.routes, key=lambda r: (sorted(r.heads), r.middle, sorted(r.tails))):
            for head in sorted(route.heads):
                for tail in sorted(route.tails):
                    chain = [head, *route.middle, tail]
                    if all(graph.direct_import_exists(importer=a, imported=b)
                           for a, b in pairwise(chain)):
                        problems.append(f"{dependency.importer} -> {dependency.imported}: {_chain(graph, chain)}")
    assert problems == [], "imports from a lower layer up (module:line -> ...):\n" + "\n".join(problems)


def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    """The helpers find what they are for (a check that cannot fail is no check)."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _strongly_connected(edges) == [["a", "b", "c"]]
    assert _cycle(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert _unit("alignflow.transport.shell") == "alignflow.transport"
    assert _unit("tasks.steps") == "tasks"


def test_a_circle_through_type_checking_imports_is_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "circle_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, other in (("a", "b"), ("b", "a")):
        (package / f"{name}.py").write_text(f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            f"    from circle_pkg.{other} import X\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _strongly_connected(_edges(_build("circle_pkg"))) == [["circle_pkg.a", "circle_pkg.b"]]
