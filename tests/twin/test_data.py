"""The experiment's data: a Megatron indexed dataset, generated, fingerprinted, and read in GPTDataset order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.errors import ConfigError, FingerprintMismatch
from alignflow.fingerprint import Fingerprinter
from alignflow.twin.data import (
    check_data_dir,
    data_sha256,
    generate_tokens,
    load_data,
    make_data,
    split_documents,
)
from tests.datasets.megatron_real import megatron_gpt_dataset


def test_generation_is_reproducible_and_its_sha256_is_the_directorys_fingerprint(tmp_path: Path) -> None:
    a = make_data(tmp_path / "a" / "d", 5000, seed=1)
    b = make_data(tmp_path / "b" / "d", 5000, seed=1)
    c = make_data(tmp_path / "c" / "d", 5000, seed=2)
    assert a == b != c
    assert a == data_sha256(tmp_path / "a" / "d") == Fingerprinter().fingerprint(tmp_path / "a").sha256
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["d.bin", "d.idx"]


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


def test_documents_end_with_the_vocabularys_last_id(tmp_path: Path) -> None:
    tokens = generate_tokens(20_000, seed=5)
    docs = split_documents(tokens, 255)
    assert len(docs) > 10
    assert np.array_equal(np.concatenate(docs), tokens)
    assert all(d[-1] == 255 and (d[:-1] != 255).all() for d in docs[:-1])
    assert split_documents(np.array([1, 2, 9, 3], dtype=np.uint16), 9)[1].tolist() == [3]  # a tail without EOD


def test_batches_are_megatron_gptdataset_samples(tmp_path: Path) -> None:
    prefix = tmp_path / "d" / "d"
    sha = make_data(prefix, 6000, seed=0)
    data = load_data(prefix, seq_length=8, seed=5, vocab_size=256, samples_needed=1200, expected_sha256=sha,
                     where="t")
    assert data.indices.num_epochs == 2  # 1200 samples of 8 tokens need two passes over 6000 tokens
    real = megatron_gpt_dataset(prefix, seed=5, seq_length=8, num_samples=1200)
    for step in (0, 1, 149):
        batch = data.batch(step, 8)
        assert batch.shape == (8, 9)
        for k, row in enumerate(batch):
            item = real[step * 8 + k]
            assert np.array_equal(row[:-1], item["tokens"].numpy())
            assert np.array_equal(row[1:], item["labels"].numpy())


def test_declared_sha256_must_match(tmp_path: Path) -> None:
    prefix = tmp_path / "d"
    make_data(prefix, 1000, seed=0)
    with pytest.raises(FingerprintMismatch, match=r"\(\.bin \+ \.idx\) has sha256 .* was declared") as err:
        load_data(prefix, seq_length=8, seed=5, vocab_size=256, samples_needed=1, expected_sha256="0" * 64, where="t")
    assert err.value.expected == "0" * 64


def test_a_token_outside_the_vocabulary_is_refused(tmp_path: Path) -> None:
    make_data(tmp_path / "d", 1000, seed=0)
    with pytest.raises(ConfigError, match="token id 255 >= vocabulary size 100"):
        load_data(tmp_path / "d", seq_length=8, seed=5, vocab_size=100, samples_needed=100, expected_sha256=None,
                  where="t")


def test_a_missing_index_names_the_file_the_format_and_how_to_make_one(tmp_path: Path) -> None:
    make_data(tmp_path / "d", 1000, seed=0)
    (tmp_path / "d.idx").unlink()
    with pytest.raises(ConfigError, match=r"torch_train: .*d\.idx not found: the data must be a Megatron indexed "
                       r"dataset .*alignflow data make"):
        load_data(tmp_path / "d", seq_length=8, seed=5, vocab_size=256, samples_needed=1, expected_sha256=None,
                  where="torch_train")


def test_the_data_directory_must_hold_the_dataset_alone(tmp_path: Path) -> None:
    make_data(tmp_path / "data" / "d", 1000, seed=0)
    check_data_dir(tmp_path / "data", "d", where="exp")
    (tmp_path / "data" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"exp: data directory .* holds notes\.txt besides d\.bin and d\.idx"):
        check_data_dir(tmp_path / "data", "d", where="exp")


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


@pytest.mark.integration  # runs `python -m alignflow` as a process
def test_cli_data_make_prints_the_sha256_and_never_overwrites(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    prefix = tmp_path / "x" / "x"
    result = cli(["data", "make", str(prefix), "--tokens", "3000", "--seed", "4"], subprocess_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == Fingerprinter().fingerprint(tmp_path / "x").sha256
    before = (tmp_path / "x" / "x.bin").read_bytes()
    again = cli(["data", "make", str(prefix), "--tokens", "10", "--seed", "4"], subprocess_env)
    assert again.returncode == ConfigError.exit_code
    assert "x.bin: already exists; an indexed dataset is never overwritten" in again.stderr
    assert "Traceback" not in again.stderr
    assert (tmp_path / "x" / "x.bin").read_bytes() == before


def test_cli_data_make_converts_a_npy_token_file(tmp_path: Path) -> None:
    tokens = generate_tokens(4000, seed=9)
    np.save(tmp_path / "old.npy", tokens)
    result = CliRunner().invoke(app, ["data", "make", str(tmp_path / "new" / "n"), "--from-npy",
                                      str(tmp_path / "old.npy")])
    assert result.exit_code == 0, result.output
    data = load_data(tmp_path / "new" / "n", seq_length=8, seed=1, vocab_size=256, samples_needed=4,
                     expected_sha256=None, where="t")
    assert np.array_equal(np.asarray(data.dataset.tokens), tokens)
    assert len(data.dataset) == len(split_documents(tokens, 255))


@pytest.mark.integration  # runs `python -m alignflow` as a process
def test_cli_data_inspect_shows_the_first_batch_in_megatron_order(tmp_path: Path,
                                                                  subprocess_env: dict[str, str]) -> None:
    prefix = tmp_path / "d"
    make_data(prefix, 3000, seed=2)
    result = CliRunner().invoke(app, ["data", "inspect", str(prefix), "--seed", "7", "--seq-length", "16",
                                      "--global-batch-size", "3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["dtype"], report["tokens"], report["max_id"]) == ("uint16", 3000, 255)
    assert report["documents"] == report["sequences"] > 1
    real = megatron_gpt_dataset(prefix, seed=7, seq_length=16, num_samples=3)
    assert report["first_batch"] == [[*real[k]["tokens"].tolist(), real[k]["labels"].tolist()[-1]] for k in range(3)]
    broken = cli(["data", "inspect", str(tmp_path / "nope")], subprocess_env)
    assert broken.returncode == ConfigError.exit_code
    assert "nope.idx and " in broken.stderr
    assert "nope.bin not found: the data must be a Megatron" in broken.stderr
