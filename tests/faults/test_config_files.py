"""Issue 16, items 11, 12 and 14: hostile configuration files and arguments end in a clear error, never in a
traceback, a hang or gigabytes of memory.

- 11: a 9x9 YAML alias bomb made `validate` run past 90 s and 1.6 GB; `&n [*n]` raised RecursionError.
- 12: an invalid env name in `npu.env` passed `validate` and `preflight`, then failed at launch without file:line.
- 14: a non-UTF-8 experiment file raised UnicodeDecodeError; `compare --out` at an existing file FileExistsError.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from alignflow.config import load_experiment, load_hosts, validate_file
from alignflow.config.yamlsource import parse_yaml
from alignflow.errors import ConfigError

pytestmark = pytest.mark.integration


def _alignflow(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _bomb(levels: int, width: int) -> str:
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\nname: bomb\nmodel: *a8\n"


def test_a_yaml_alias_bomb_is_refused_quickly_with_file_and_line(tmp_path: Path,
                                                                   subprocess_env: dict[str, str]) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(9, 9))
    # 9^9 = 387 million nodes if expanded: a bound of 60 s and the default memory is a test that fails without a cap
    done = _alignflow(subprocess_env, "validate", str(path))
    assert done.returncode != 0
    assert f"{path}:" in done.stderr, done.stderr
    assert "alias" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("text", ["name: &n [*n]\n", "model: &m {layers: *m}\nname: x\n"], ids=["list", "map"])
def test_a_recursive_alias_is_refused_with_file_and_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"{path}:1: recursive YAML alias"):
        validate_file(path)


def test_ordinary_aliases_still_work(tmp_path: Path) -> None:
    """A cap, not a ban: an anchor reused a few times is still an ordinary YAML feature."""
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  a: &h {role: cpu, workdir: /x, env: {A: '1'}}\n  b: *h\n")
    assert load_hosts(path).get("b").env == {"A": "1"}


def test_nesting_too_deep_for_the_parser_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=rf"{path}:1: malformed YAML: nested too deeply \(more than 100 levels\)"):
        validate_file(path)


def test_block_nesting_too_deep_names_the_line_where_it_goes_too_deep(tmp_path: Path) -> None:
    """The cap does not hang on Python's recursion limit (which importing MindSpore raises tenfold): a document 101
    levels deep is refused at the line of its 101st level, one 100 deep is read."""
    def nested(levels: int) -> str:
        return "".join("  " * i + f"k{i}:\n" for i in range(levels - 1)) + "  " * (levels - 1) + "v: 1\n"

    path = tmp_path / "deep.yaml"
    path.write_text(nested(101))
    with pytest.raises(ConfigError, match=rf"{path}:101: malformed YAML: nested too deeply"):
        parse_yaml(path.read_text(), path)
    assert parse_yaml(nested(100), path).line_of((*(f"k{i}" for i in range(99)), "v")) == 100


@pytest.mark.parametrize("section", ["npu", "gpu", "steps.gpu_train"])
@pytest.mark.parametrize("name", ["BAD NAME", "1X", "A-B", "A=B"])
def test_an_invalid_env_name_is_caught_by_validate_at_its_line(tmp_path: Path, repo_root: Path, section: str,
                                                              name: str) -> None:
    text = (repo_root / "experiments" / "demo.yaml").read_text()
    if section.startswith("steps."):
        block = f"steps:\n  {section.split('.')[1]}:\n    env:\n      GOOD: x\n      '{name}': y\n"
    else:
        block = f"{section}:\n  env:\n    GOOD: x\n    '{name}': y\n"
    path = tmp_path / "exp.yaml"
    path.write_text(text + block)
    line = len((text + block).splitlines())
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert f"{path}:{line}: {section}.env.{name}: " in str(info.value)
    assert "not a valid environment variable name" in str(info.value)


def test_a_file_that_is_not_utf8_is_a_clear_error_with_its_line(tmp_path: Path, subprocess_env: dict[str, str]
                                                                 ) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: demo\ndescription: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"{path}:2: not UTF-8 text: byte 0xe9"):
        load_experiment(path)
    done = _alignflow(subprocess_env, "validate", str(path))
    assert done.returncode != 0
    assert f"{path}:2: not UTF-8" in done.stderr
    assert "Traceback" not in done.stderr


def test_compare_out_at_an_existing_file_is_exit_2_and_the_file_is_untouched(tmp_path: Path,
                                                                             subprocess_env: dict[str, str]) -> None:
    from tests.logfixtures import make_run, megatron_lines, mindformers_lines, write

    run = make_run(20, seed=1)
    write(tmp_path / "npu.log", mindformers_lines(run))
    write(tmp_path / "gpu.log", megatron_lines(run))
    taken = tmp_path / "report.html"
    taken.write_text("my notes")
    done = _alignflow(subprocess_env, "compare", str(tmp_path / "gpu.log"), str(tmp_path / "npu.log"),
                      "--out", str(taken))
    assert done.returncode == 2, done.stderr
    assert f"--out {taken}: exists and is not a directory" in done.stderr
    assert "Traceback" not in done.stderr
    assert taken.read_text() == "my notes"
