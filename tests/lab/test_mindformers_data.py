"""The lab's data: one Megatron indexed-dataset document, which both real MindFormers and the twin read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("megatron.core")

from alignflow.errors import FingerprintMismatch
from alignflow.fingerprint import sha256_of
from alignflow.labs.mindformers_cpu.data import write_indexed
from alignflow.twin.data import generate_tokens, load_data

pytestmark = [pytest.mark.slow,  # megatron-core's and MindFormers' dataset code
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]


def test_the_twin_reads_the_indexed_document_verified_by_its_directory_digest(tmp_path: Path) -> None:
    prefix = write_indexed(tmp_path / "data", "doc", tokens=4097, seed=7)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["doc.bin", "doc.idx"]
    digest = sha256_of(tmp_path / "data")
    data = load_data(prefix, seq_length=32, seed=1234, vocab_size=256, samples_needed=8, expected_sha256=digest,
                     where="test")
    assert len(data.dataset) == 1  # one document: every token, in order
    np.testing.assert_array_equal(data.dataset.get(0), generate_tokens(4097, 7, 256))
    assert data.num_samples == 4096 // 32  # one epoch of GPTDataset samples (seq_length + 1 tokens each)
    with pytest.raises(FingerprintMismatch, match=r"\(\.bin \+ \.idx\) has sha256"):
        load_data(prefix, seq_length=32, seed=1234, vocab_size=256, samples_needed=8, expected_sha256="0" * 64,
                  where="test")


def test_the_writer_is_deterministic(tmp_path: Path) -> None:
    write_indexed(tmp_path / "a", "doc", tokens=1000, seed=3)
    write_indexed(tmp_path / "b", "doc", tokens=1000, seed=3)
    assert sha256_of(tmp_path / "a") == sha256_of(tmp_path / "b")


def test_data_generate_with_one_document_writes_the_lab_s_bytes(tmp_path: Path) -> None:
    """`data.generate: {documents: one}` (experiments/mindformers-cpu.yaml) makes what the lab's writer makes, so the
    experiment's data is made on first use and its declared sha256 holds."""
    from alignflow.twin.data import make_data

    write_indexed(tmp_path / "lab", "doc", tokens=1000, seed=3)
    (tmp_path / "twin").mkdir()
    make_data(tmp_path / "twin" / "doc", 1000, 3, one_document=True)
    assert sha256_of(tmp_path / "twin") == sha256_of(tmp_path / "lab")
