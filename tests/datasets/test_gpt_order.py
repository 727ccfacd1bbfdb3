"""alignflow's GPTDataset order equals megatron-core's: all three indices element for element, and the samples.

megatron-core builds its `GPTDataset` (through `BlendedMegatronDatasetBuilder`, as pretrain_gpt.py does) over an
indexed dataset written by its own `IndexedDatasetBuilder`; alignflow builds its indices from its own reader of the
same files. Cases cover one and many documents, one epoch, several epochs with and without the separate final
epoch, `add_extra_token_to_sequence` off, a validation split that keeps its partial last sample, and a train
split that is not the whole dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alignflow.datasets.gpt import build_indices, sample_tokens, train_documents
from alignflow.datasets.indexed import open_indexed
from tests.datasets.megatron_real import megatron_gpt_dataset, write_with_megatron


def documents(count: int, max_len: int, seed: int) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    if count == 1:  # one document of exactly max_len tokens
        return [rng.randint(0, 255, size=max_len).astype(np.uint16)]
    return [rng.randint(0, 255, size=int(n)).astype(np.uint16) for n in rng.randint(1, max_len + 1, size=count)]


# (documents, longest document, seq_length, num_samples, seed, add_extra_token, epochs, separate final epoch)
CASES = [
    (1, 5000, 32, 100, 1234, True, 1, False),  # the twin's old layout: one document
    (1, 3000, 16, 400, 7, True, 3, True),  # three epochs of one document: the last one on its own
    (30, 50, 16, 20, 1234, True, 1, False),
    (30, 50, 16, 94, 0, True, 2, False),  # the final epoch gives >= 80 % of an epoch: shuffled in
    (30, 50, 16, 89, 0, True, 2, False),  # 40 of 49 samples: >= int(0.8 * 49), still shuffled in
    (30, 50, 16, 88, 0, True, 2, False),  # 39 of 49: exactly int(0.8 * 49) — the threshold is strict
    (30, 50, 16, 80, 3, True, 2, True),  # it gives < 80 %: kept out of the global shuffle
    (200, 300, 32, 5000, 42, True, 6, True),
    (57, 90, 8, 700, 99, False, 3, True),  # add_extra_token_to_sequence off: samples do not overlap
    (57, 90, 8, None, 5, True, 1, False),  # num_samples None: exactly one epoch
]


@pytest.mark.parametrize(("docs", "max_len", "seq", "samples", "seed", "extra", "epochs", "separate"), CASES)
def test_indices_and_samples_equal_megatron_cores(tmp_path: Path, docs: int, max_len: int, seq: int,
                                                  samples: int | None, seed: int, extra: bool, epochs: int,
                                                  separate: bool) -> None:
    prefix = tmp_path / "data"
    write_with_megatron(prefix, documents(docs, max_len, seed + docs))
    real = megatron_gpt_dataset(prefix, seed=seed, seq_length=seq, num_samples=samples, add_extra_token=extra)
    data = open_indexed(prefix, where="test")
    ours = build_indices(data.sequence_lengths, train_documents(len(data), "100,0,0"), num_samples=samples,
                         seq_length=seq, seed=seed, add_extra_token=extra)
    assert (ours.num_epochs, ours.separate_final_epoch) == (epochs, separate)  # the case covers what it says
    for name in ("document_index", "sample_index", "shuffle_index"):
        theirs, mine = np.asarray(getattr(real, name)), getattr(ours, name)
        assert mine.dtype == theirs.dtype, name
        assert mine.shape == theirs.shape, name
        assert np.array_equal(mine, theirs), name
    for i in range(min(len(real), 64)):
        text = sample_tokens(data, ours, i)
        item = real[i]
        assert np.array_equal(text[:-1] if extra else text, item["tokens"].numpy())
        if extra:
            assert np.array_equal(text[1:], item["labels"].numpy())


def test_a_validation_split_keeps_its_partial_last_sample_as_megatron_does(tmp_path: Path) -> None:
    prefix = tmp_path / "data"
    write_with_megatron(prefix, documents(13, 40, 11))
    for drop_last in (True, False):
        real = megatron_gpt_dataset(prefix, seed=3, seq_length=16, num_samples=None, valid=True, drop_last=drop_last)
        data = open_indexed(prefix, where="test")
        ours = build_indices(data.sequence_lengths, np.arange(len(data), dtype=np.int32), num_samples=None,
                             seq_length=16, seed=3, drop_last_partial_sequence=drop_last)
        for name in ("document_index", "sample_index", "shuffle_index"):
            assert np.array_equal(getattr(ours, name), np.asarray(getattr(real, name))), (drop_last, name)
        last = int(np.argmax(ours.shuffle_index == len(ours) - 1))  # the partial sample, padded with -1
        text = sample_tokens(data, ours, last)
        assert (text == -1).any() != drop_last
        tokens = np.where(text[:-1] == -1, 0, text[:-1])  # GPTDataset maps the pad id to 0 in its tokens
        assert np.array_equal(tokens, real[last]["tokens"].numpy())


def test_a_train_split_of_part_of_the_data_uses_megatrons_document_range(tmp_path: Path) -> None:
    prefix = tmp_path / "data"
    write_with_megatron(prefix, documents(41, 60, 2))
    real = megatron_gpt_dataset(prefix, seed=1234, seq_length=16, num_samples=90, split="85,15,0")
    data = open_indexed(prefix, where="test")
    docs = train_documents(len(data), "85,15,0")
    assert np.array_equal(docs, np.asarray(real.indices))
    ours = build_indices(data.sequence_lengths, docs, num_samples=90, seq_length=16, seed=1234)
    for name in ("document_index", "sample_index", "shuffle_index"):
        assert np.array_equal(getattr(ours, name), np.asarray(getattr(real, name))), name
