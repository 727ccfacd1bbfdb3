"""The run's data file: generated in process when absent (its digest used), a failure reported as AlignflowError."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alignflow.config import load_experiment
from alignflow.errors import AlignflowError
from alignflow.fingerprint import Fingerprinter
from alignflow.runner.session import prepare_data


def _experiment(repo_root: Path, tmp_path: Path, data: dict[str, object]) -> Path:
    exp = yaml.safe_load((repo_root / "experiments" / "demo.yaml").read_text())
    exp["data"] = data
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def test_absent_data_is_generated_with_the_declared_digest(repo_root: Path, tmp_path: Path) -> None:
    declared = yaml.safe_load((repo_root / "experiments" / "demo.yaml").read_text())["data"]
    exp = load_experiment(_experiment(repo_root, tmp_path, {**declared, "path": "data/demo.tokens"}))
    ref = prepare_data(exp, memo=None)
    fp = Fingerprinter().fingerprint(tmp_path / "data" / "demo.tokens")
    assert (ref.sha256, ref.size, ref.path) == (fp.sha256, fp.size, str(tmp_path / "data" / "demo.tokens"))
    assert ref.sha256 == declared["sha256"]
    assert prepare_data(exp, memo=None) == ref  # present now: fingerprinted, same reference


def test_a_failed_generation_is_an_alignflow_error_with_the_reason(repo_root: Path, tmp_path: Path) -> None:
    exp = load_experiment(_experiment(repo_root, tmp_path, {"path": "one.tokens", "generate": {"tokens": 1}}))
    with pytest.raises(AlignflowError, match="at least 2"):
        prepare_data(exp, memo=None)
    (tmp_path / "blocked").write_text("a file where a directory must be")
    exp = load_experiment(_experiment(repo_root, tmp_path, {"path": "blocked/x.tokens", "generate": {"tokens": 64}}))
    with pytest.raises(AlignflowError, match=r"cannot generate data\.path"):
        prepare_data(exp, memo=None)
