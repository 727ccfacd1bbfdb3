"""The core library is free of the orchestrator: nothing under alignflow/ imports prefect, flows or tasks.

Prefect lives in tasks/ and flows/; the commands that drive it (`run`, `rerun`, `reproduce`, `serve`) reach the
`alignflow` command line through the `alignflow.commands` entry point group, not through an import in the core.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ORCHESTRATION = ("prefect", "flows", "tasks")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_no_core_module_imports_the_orchestrator(repo_root: Path) -> None:
    offending = [f"{path.relative_to(repo_root)}:{line}: import {name}"
                 for path in sorted((repo_root / "alignflow").rglob("*.py"))
                 for line, name in _imports(path) if name.split(".")[0] in ORCHESTRATION]
    assert offending == []


@pytest.mark.integration
def test_importing_every_core_module_and_the_cli_loads_no_prefect(repo_root: Path,
                                                                  subprocess_env: dict[str, str]) -> None:
    probe = """
import importlib, pkgutil, sys, alignflow
names = [m.name for m in pkgutil.walk_packages(alignflow.__path__, "alignflow.")
         if not m.name.endswith("__main__") and ".store.migrations" not in m.name
         and ".megatron_fixes." not in m.name]  # a declared fix runs on the GPU host, inside Megatron-LM's launcher
for name in names:
    importlib.import_module(name)
import alignflow.cli
print(len(names), sorted(m for m in sys.modules if m.split(".")[0] == "prefect")[:5])
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=subprocess_env,
                          cwd=repo_root, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    count, loaded = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(count) > 50
    assert loaded == "[]"


@pytest.mark.integration
def test_the_controller_of_a_run_loads_no_torch_matplotlib_or_pandas(repo_root: Path,
                                                                     subprocess_env: dict[str, str]) -> None:
    # `alignflow run` imports the flow and every step's code; the steps that need torch (conversion, diagnosis's
    # tensor ops) import it when they run. Importing it up front cost every run ~2 s, a fully cached one too.
    # matplotlib likewise (~0.45 s): only the compare step draws; the run summary reads the drawn thumbnails. And
    # pandas (~0.3 s): only a step that reads a log (a training's check, its progress, compare) parses one.
    probe = ("import sys, alignflow.cli, flows.alignment, flows.cli, alignflow.runner.run; "
             "print(sorted(m for m in ('torch', 'matplotlib', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=subprocess_env,
                          cwd=repo_root, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_orchestrator_commands_join_the_cli_through_the_entry_point() -> None:
    import importlib.metadata

    from alignflow.cli import COMMAND_GROUP, app

    (entry,) = importlib.metadata.entry_points(group=COMMAND_GROUP)
    assert entry.value == "flows.cli:register"
    names = {c.name for c in app.registered_commands}
    assert {"run", "rerun", "reproduce", "serve", "show", "preflight", "hash"} <= names


@pytest.mark.integration
@pytest.mark.parametrize("command", ["run", "serve"])
def test_the_orchestrator_commands_answer_help(command: str, subprocess_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "alignflow", command, "--help"], capture_output=True, text=True,
                          env=subprocess_env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout
