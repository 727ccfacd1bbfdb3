"""The run's data: an indexed dataset generated in process when absent (its digest used), checked when present,
a failure reported as AlignflowError with nothing half-made left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alignflow.config import load_experiment
from alignflow.errors import AlignflowError, ConfigError
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
    exp = load_experiment(_experiment(repo_root, tmp_path, {**declared, "path": "data/demo"}))
    ref = prepare_data(exp, memo=None)
    fp = Fingerprinter().fingerprint(tmp_path / "data" / "demo")
    assert (ref.sha256, ref.size, ref.path) == (fp.sha256, fp.size, str(tmp_path / "data" / "demo"))
    assert ref.sha256 == declared["sha256"]
    assert sorted(p.name for p in (tmp_path / "data" / "demo").iterdir()) == ["demo.bin", "demo.idx"]
    assert prepare_data(exp, memo=None) == ref  # present now: fingerprinted, same reference


def test_a_failed_generation_is_an_alignflow_error_with_the_reason(repo_root: Path, tmp_path: Path) -> None:
    exp = load_experiment(_experiment(repo_root, tmp_path, {"path": "one", "prefix": "one",
                                                            "generate": {"tokens": 1}}))
    with pytest.raises(AlignflowError, match="at least 2"):
        prepare_data(exp, memo=None)
    assert not (tmp_path / "one").exists()  # nothing half-made
    assert sorted(p.name for p in tmp_path.iterdir()) == [".one.lock", "exp.yaml"]  # the lock stays (alignflow.once)
    (tmp_path / "blocked").write_text("a file where a directory must be")
    exp = load_experiment(_experiment(repo_root, tmp_path, {"path": "blocked/x", "prefix": "x",
                                                            "generate": {"tokens": 64}}))
    with pytest.raises(AlignflowError, match=r"cannot generate data\.path"):
        prepare_data(exp, memo=None)


def test_a_data_directory_without_its_index_is_refused_naming_the_file(repo_root: Path, tmp_path: Path) -> None:
    from alignflow.twin.data import make_data

    make_data(tmp_path / "data" / "demo", 2000, seed=1)
    path = _experiment(repo_root, tmp_path, {"path": "data", "prefix": "demo"})
    exp = load_experiment(path)
    (tmp_path / "data" / "demo.idx").unlink()
    with pytest.raises(ConfigError, match=r"data/demo\.idx not found: the data must be a Megatron indexed dataset"):
        prepare_data(exp, memo=None)  # gone after the experiment was read: the run refuses it
    with pytest.raises(ConfigError, match=r"exp\.yaml:\d+: data\.prefix: .*data has no demo\.idx"):
        load_experiment(path)  # gone before: the file is refused where it is read (issue 40)


def test_data_checked_once_is_not_checked_again_while_its_content_is_the_same(
        repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: the check reads the index with numpy; data whose sha256 passed it once passes it again."""
    from alignflow.fingerprint import HashMemo
    from alignflow.twin import data as twin_data

    twin_data.make_data(tmp_path / "data" / "demo", 2000, seed=1)
    exp = load_experiment(_experiment(repo_root, tmp_path, {"path": "data", "prefix": "demo"}))
    checked: list[Path] = []
    real = twin_data.check_data_dir

    def counted(directory: Path, prefix: str, *, where: str) -> None:
        checked.append(directory)
        real(directory, prefix, where=where)

    monkeypatch.setattr(twin_data, "check_data_dir", counted)
    memo = HashMemo(tmp_path / "memo.sqlite")
    try:
        first = prepare_data(exp, memo=memo)
        assert prepare_data(exp, memo=memo) == first
        assert len(checked) == 1  # the second found its sha256 checked
        (tmp_path / "data" / "notes.txt").write_text("not data")
        with pytest.raises(ConfigError, match=r"holds notes\.txt besides demo\.bin and demo\.idx"):
            prepare_data(exp, memo=memo)  # anything besides the dataset: checked (and refused) again
        (tmp_path / "data" / "notes.txt").unlink()
        idx = tmp_path / "data" / "demo.idx"
        idx.write_bytes(idx.read_bytes()[:-8])  # other content: checked again, and refused
        with pytest.raises(ConfigError, match=r"demo\.idx holds \d+ bytes"):
            prepare_data(exp, memo=memo)
        assert len(checked) == 3
    finally:
        memo.close()


@pytest.mark.parametrize(("data", "message"), [
    ({"path": "data/demo.npy", "prefix": "demo"}, r"data\.path 'data/demo\.npy' names a file: it is the directory"),
    ({"path": "data/demo.tokens"}, r"data: prefix missing: the data must be a Megatron indexed dataset"),
])
def test_a_npy_or_prefixless_data_path_is_a_validation_error(repo_root: Path, tmp_path: Path,
                                                             data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_experiment(_experiment(repo_root, tmp_path, data))
    assert "exp.yaml" in str(err.value)  # the file is named (with its line)


@pytest.mark.integration  # transformers' model classes (the generated base) start processes as they import
def test_runs_starting_together_generate_the_data_and_the_base_once_and_all_verify_them(
        repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49: the second of two runs lost the rename of the data both had generated and ended `error`."""
    import threading

    from alignflow.convert import hf
    from alignflow.runner.session import prepare_base

    doc = yaml.safe_load((repo_root / "experiments" / "demo-hf-base.yaml").read_text())
    doc["data"]["path"], doc["base"]["path"] = "data/demo", "base/qwen3"
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    exp = load_experiment(tmp_path / "exp.yaml")
    made: list[str] = []
    real = hf.make_hf_checkpoint

    def counted(*args: object, **kwargs: object) -> None:
        made.append("base")
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(hf, "make_hf_checkpoint", counted)
    said: list[str] = []
    refs: list[tuple[object, object]] = []

    def run(i: int) -> None:
        data = prepare_data(exp, memo=None, run_id=f"run{i}", events=said.append)
        refs.append((data, prepare_base(exp, memo=None, run_id=f"run{i}", events=said.append)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(refs) == 3
    assert len(set(refs)) == 1  # every run verified the same data and base, by fingerprint
    assert made == ["base"]
    assert sorted(m.split(":")[0] for m in said if m.startswith("created")) == [
        "created the base checkpoint qwen3", "created the data demo"]
    assert all(m.endswith(" is creating it)") for m in said if m.startswith("waiting"))
