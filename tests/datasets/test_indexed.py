"""alignflow's `.bin/.idx` writer and reader are megatron-core's format: byte-identical files, each side reads the
other's, and a broken or foreign file is refused with its name and the format it should have."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alignflow.datasets.indexed import open_indexed, write_indexed
from alignflow.errors import ConfigError
from tests.datasets.megatron_real import write_with_megatron

DOCS = [np.array(d, dtype=np.uint16) for d in ([5, 6, 7, 255], [1], [9, 9, 9, 9, 9, 255], [65535, 0])]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_written_files_are_byte_identical_to_megatron_cores(tmp_path: Path, dtype: type) -> None:
    write_with_megatron(tmp_path / "theirs", DOCS, dtype=dtype)
    write_indexed(tmp_path / "ours", DOCS, dtype=dtype)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"theirs{ext}").read_bytes(), ext


def test_each_reader_reads_the_other_writers_files(tmp_path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    write_with_megatron(tmp_path / "theirs", DOCS)
    write_indexed(tmp_path / "ours", DOCS)
    ours_of_theirs = open_indexed(tmp_path / "theirs", where="test")
    theirs_of_ours = IndexedDataset(str(tmp_path / "ours"), multimodal=False, mmap=True)
    assert len(ours_of_theirs) == len(theirs_of_ours) == len(DOCS)
    assert ours_of_theirs.dtype == np.uint16
    for i, doc in enumerate(DOCS):
        assert np.array_equal(ours_of_theirs.get(i), doc)
        assert np.array_equal(theirs_of_ours.get(i), doc)
        assert np.array_equal(ours_of_theirs.get(i, 1, 1), theirs_of_ours.get(i, offset=1, length=1))
    assert np.array_equal(ours_of_theirs.document_indices, theirs_of_ours.document_indices)


def test_an_existing_dataset_is_never_overwritten(tmp_path: Path) -> None:
    write_indexed(tmp_path / "d", DOCS)
    before = (tmp_path / "d.bin").read_bytes()
    with pytest.raises(ConfigError, match=r"d\.bin: already exists"):
        write_indexed(tmp_path / "d", DOCS[:1])
    assert (tmp_path / "d.bin").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx"]  # no temporary file left


def test_a_failed_write_leaves_no_dataset(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="do not fit uint16"):
        write_indexed(tmp_path / "d", [np.array([1, 2]), np.array([70000])])
    assert list(tmp_path.iterdir()) == []


def test_bad_files_are_refused_with_their_name_and_the_format(tmp_path: Path) -> None:
    write_indexed(tmp_path / "d", DOCS)
    idx = (tmp_path / "d.idx").read_bytes()

    def refused(match: str) -> None:
        with pytest.raises(ConfigError, match=match):
            open_indexed(tmp_path / "d", where="torch_train")

    (tmp_path / "d.idx").write_bytes(idx[:-8])
    refused(r"torch_train: .*d\.idx holds \d+ bytes; its header .* needs \d+: the index is truncated")
    (tmp_path / "d.idx").write_bytes(b"NOTANIDX" + idx[8:])
    refused(r"d\.idx is not an indexed-dataset index \(no MMIDIDX header\): the data must be a Megatron indexed")
    (tmp_path / "d.idx").write_bytes(idx)
    (tmp_path / "d.bin").write_bytes((tmp_path / "d.bin").read_bytes()[:-2])
    refused(r"d\.bin holds 24 bytes, but .*d\.idx describes 13 uint16 tokens \(26 bytes\)")
    (tmp_path / "d.idx").unlink()
    refused(r"d\.idx not found: the data must be a Megatron indexed dataset \(<prefix>\.bin \+ <prefix>\.idx")


def test_a_npy_token_file_is_refused_as_the_wrong_format(tmp_path: Path) -> None:
    np.save(tmp_path / "demo.npy", np.arange(100, dtype=np.uint16))
    with pytest.raises(ConfigError, match=r"demo\.npy' names a file, not a prefix: the data must be a Megatron "
                       r"indexed dataset .*--from-npy"):
        open_indexed(tmp_path / "demo.npy", where="gpu_train")
