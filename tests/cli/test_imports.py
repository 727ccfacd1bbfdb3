"""A command line that answers at once (issue 48 item 2): what `alignflow --help`, `validate` and a configuration
error load is held to a named set of packages. No framework (torch, MindSpore, Megatron), no Prefect, no pandas,
matplotlib or numpy: each costs from 0.3 s to seconds before the first line (benchmarks/bench_cli.py times them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a fresh interpreter per command: sys.modules as a user's process has it

# typer and rich with what they load themselves (rich's help renderer: markdown_it, pygments; typer's shell
# completion: shellingham).
HELP = frozenset({"alignflow", "flows", "typer", "rich", "shellingham", "annotated_doc", "markdown_it", "mdurl",
                  "pygments", "attr"})
# A command's parameters are coerced by typer through pydantic; the configuration is YAML read into pydantic models.
COMMAND = HELP | {"yaml", "pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection",
                  "cython_runtime"}
NEVER = ("torch", "mindspore", "megatron", "prefect", "pandas", "matplotlib", "numpy", "scipy", "sqlalchemy",
         "plotly", "jinja2", "paramiko", "safetensors")

_PROBE = """
import atexit, runpy, sys
def report():
    names = {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
    sys.__stdout__.write("\\nLOADED " + " ".join(sorted(n for n in names if not n.startswith("_"))) + "\\n")
    sys.__stdout__.write("CONFIG " + str("alignflow.config" in sys.modules) + "\\n")
atexit.register(report)
sys.argv = ["alignflow", *sys.argv[1:]]
runpy.run_module("alignflow", run_name="__main__")
"""


def _loaded(repo_root: Path, env: dict[str, str], tmp_path: Path, *args: str) -> tuple[set[str], bool, int]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=repo_root, capture_output=True, text=True,
                          env={**env, "ALIGNFLOW_STATE_DIR": str(tmp_path / "state")}, timeout=120, check=False)
    lines = done.stdout.splitlines()
    loaded = next(line for line in lines if line.startswith("LOADED ")).split()[1:]
    config = next(line for line in lines if line.startswith("CONFIG ")).split()[1] == "True"
    return set(loaded), config, done.returncode


def test_help_loads_typer_rich_and_the_command_modules_only(repo_root: Path, subprocess_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    loaded, config, code = _loaded(repo_root, subprocess_env, tmp_path, "--help")
    assert code == 0
    assert loaded <= HELP, sorted(loaded - HELP)
    assert not config, "alignflow --help loaded the configuration models (pydantic)"


@pytest.mark.parametrize("args", [["validate", "experiments/demo.yaml"], ["validate", "experiments/demoo.yaml"],
                                  ["run", "experiments/demoo.yaml"], ["run", "demo", "--only", "bogus"],
                                  ["preflight", "demoo"]])
def test_validate_and_configuration_errors_load_no_framework_prefect_or_pandas(
        repo_root: Path, subprocess_env: dict[str, str], tmp_path: Path, args: list[str]) -> None:
    loaded, _, code = _loaded(repo_root, subprocess_env, tmp_path, *args)
    assert code in (0, 2)
    assert [name for name in NEVER if name in loaded] == []
    assert loaded <= COMMAND, sorted(loaded - COMMAND)
