"""The guides' cheap blocks, run as written in a copy of the checkout (docs/guide/; issue 34).

The README's walk (test_walk.py) trains; these blocks read what a checkout ships - its experiment and host files,
the packaged conversion specs, two real Megatron-LM logs of tests/data/logs/ - so each takes a second or two. Every
command runs with bash in a fresh copy of those files, as a new user (tests/journeys/conftest.py's `user_env`), and
what it prints is checked against the guide's sample (`<!-- journey-output: NAME -->`). The guides' other shell
blocks need what this machine has not (a real Ascend, GPU or Slurm host, a team server, a recorded run) and say so
(`<!-- not-run: WHY -->`, tests/test_doc_blocks.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.journeys.conftest import user_env
from tests.journeys.markdown import Block, documents, marked_blocks, sample_matches

pytestmark = pytest.mark.integration

# name -> (kind, the block it checks the output of)
BLOCKS = {"validate": "commands", "validate-output": "output",
          "compare-shipped": "commands", "compare-shipped-output": "output",
          "convert-specs": "commands", "convert-specs-output": "output"}
CHECKOUT = ("hosts.yaml", "hosts.ssh.example.yaml", "nightly.yaml", "experiments", "tests/data/logs")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory, repo_root: Path) -> Path:
    """The files of a checkout the guides' cheap blocks read, copied (nothing they write lands in the repository)."""
    work = tmp_path_factory.mktemp("guides") / "alignflow"
    for name in CHECKOUT:
        source, target = repo_root / name, work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    (work.parent / "home").mkdir()
    return work


@pytest.fixture(scope="module")
def blocks(repo_root: Path) -> dict[str, Block]:
    return marked_blocks(documents(repo_root))


def run_block(block: Block, work: Path) -> str:
    """Every command of `block`, with bash, in the copy: each must exit 0. Their output, together."""
    out = []
    for command in block.commands:
        done = subprocess.run(["bash", "-c", command], cwd=work, env=user_env(work.parent / "home"),
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"{block.where}: `{command}` exited {done.returncode}:\n{done.stdout}{done.stderr}"
        out.append(done.stdout)
    return "".join(out)


@pytest.mark.parametrize("name", [n for n, kind in BLOCKS.items() if kind == "commands"])
def test_a_guide_block_runs_as_written_and_prints_its_sample(name: str, blocks: dict[str, Block],
                                                               checkout: Path) -> None:
    assert name in blocks, f"no block is marked `<!-- journey: {name} -->` in the docs"
    output = run_block(blocks[name], checkout)
    assert sample_matches(blocks[f"{name}-output"], output) == []
