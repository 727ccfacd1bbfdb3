from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.errors import ConfigError, FingerprintMismatch
from alignflow.fingerprint import sha256_file_uncached
from alignflow.reference.data import generate_tokens, load_data, make_data, shuffle_index


def test_generation_is_reproducible_and_seed_dependent(tmp_path: Path) -> None:
    a = make_data(tmp_path / "a.tokens", 5000, seed=1)
    b = make_data(tmp_path / "b.tokens", 5000, seed=1)
    c = make_data(tmp_path / "c.tokens", 5000, seed=2)
    assert a == b != c
    assert a == sha256_file_uncached(tmp_path / "a.tokens")


def test_tokens_have_learnable_structure() -> None:
    tokens = generate_tokens(50_000, seed=3).astype(np.int64)
    assert tokens.min() >= 0
    assert tokens.max() == 255
    counts = np.zeros((256, 256))
    np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    p_next = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nansum(counts / counts.sum() * np.log2(np.where(p_next > 0, p_next, 1)))
    # the next token given the previous one carries far less than the 8 bits of a uniform stream
    assert h < 4.0


def test_order_is_numpy_randomstate_shuffle() -> None:
    expected = np.arange(100, dtype=np.uint32)
    np.random.RandomState(1234).shuffle(expected)
    assert np.array_equal(shuffle_index(100, 1234), expected)
    assert not np.array_equal(shuffle_index(100, 1234), shuffle_index(100, 42))


def test_batches_are_gptdataset_windows(tmp_path: Path) -> None:
    path = tmp_path / "d.tokens"
    sha = make_data(path, 1000, seed=0)
    data = load_data(path, seq_length=8, seed=5, vocab_size=256, samples_needed=10, expected_sha256=sha, where="t")
    tokens = np.load(path)
    batch = data.batch(1, 3)
    assert batch.shape == (3, 9)
    for row, sample in zip(batch, data.order[3:6], strict=True):
        assert np.array_equal(row, tokens[sample * 8 : sample * 8 + 9])  # consecutive samples share one token


def test_declared_sha256_must_match(tmp_path: Path) -> None:
    path = tmp_path / "d.tokens"
    make_data(path, 1000, seed=0)
    with pytest.raises(FingerprintMismatch, match="was declared") as err:
        load_data(path, seq_length=8, seed=5, vocab_size=256, samples_needed=1, expected_sha256="0" * 64, where="t")
    assert err.value.expected == "0" * 64


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"vocab_size": 100}, "token id"),
    ({"samples_needed": 10_000}, "make a larger file"),
])
def test_unusable_files_are_rejected(tmp_path: Path, kwargs: dict[str, int], message: str) -> None:
    path = tmp_path / "d.tokens"
    make_data(path, 1000, seed=0)
    args = {"vocab_size": 256, "samples_needed": 1} | kwargs
    with pytest.raises(ConfigError, match=message):
        load_data(path, seq_length=8, seed=5, expected_sha256=None, where="t", **args)


def test_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make-data"):
        load_data(tmp_path / "nope", seq_length=8, seed=5, vocab_size=256, samples_needed=1, expected_sha256=None,
                  where="t")


def test_cli_make_data_prints_the_sha256(tmp_path: Path) -> None:
    out = tmp_path / "x.tokens"
    result = CliRunner().invoke(app, ["reference", "make-data", str(out), "--tokens", "3000", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert result.output.split()[0] == sha256_file_uncached(out)
    assert np.load(out).shape == (3000,)
