"""What the README's tour writes stays out of git (issue 47): its state dir, and the directories its commands name
(`alignflow export RUN --tensorboard tb`), are ignored, so that `git status` after the tour shows nothing new."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # git check-ignore: git's own reading of .gitignore


def test_the_tours_outputs_are_git_ignored(repo_root: Path) -> None:
    readme = (repo_root / "README.md").read_text()
    written = re.findall(r"^alignflow .*--tensorboard (\S+)", readme, flags=re.MULTILINE)
    assert written == ["tb"]
    for directory in [".alignflow", *written]:
        done = subprocess.run(["git", "check-ignore", "-q", f"{directory}/events.out"], cwd=repo_root, check=False)
        assert done.returncode == 0, f"{directory}/ is not git-ignored"
