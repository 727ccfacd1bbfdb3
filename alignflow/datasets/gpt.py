"""megatron-core `GPTDataset`'s sample order, in numpy: which tokens sample `i` of a training holds.

`GPTDataset._build_document_sample_shuffle_indices` (https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/
megatron/core/datasets/gpt_dataset.py; the index code is the same from core 0.16 to 0.19) builds three indices
from one `numpy.random.RandomState(seed)`:

1. epochs: the fewest whole passes over the split's sequences that hold `num_samples * seq_length +
   add_extra_token` tokens (`_get_num_epochs`); with more than one, the final epoch is kept out of the global
   shuffle when it contributes fewer than 80 % of an epoch's samples (`separate_final_epoch`);
2. the document index: the split's sequence ids repeated once per epoch, shuffled (the first epochs and a separate
   final epoch shuffled on their own, in that order; `_build_document_index`);
3. the sample index: where each sample starts in the documents laid end to end — sample `i` starts at token
   `i * seq_length` and holds `seq_length + add_extra_token` tokens, so consecutive samples share one token
   (`helpers.cpp::build_sample_idx`, vectorised here);
4. the shuffle index: a shuffled `arange` over the samples (before the separate final epoch, then over it;
   `_build_shuffle_index`).

Sample `k` of the training is `sample_index` row `shuffle_index[k]` (`_query_document_sample_shuffle_indices`).
The train split's sequences are `arange(0, round(split[0] * N))` (`BlendedMegatronDatasetBuilder`,
`convert_split_vector_to_split_matrix`). `tests/datasets/test_gpt_order.py` compares all three indices with
megatron-core's own, element for element.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from alignflow.datasets.indexed import IndexedDataset
from alignflow.errors import ConfigError

SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
PAD_TOKEN_ID = -1  # `_PAD_TOKEN_ID` of gpt_dataset.py: NullTokenizer has no pad id


def split_weights(split: str) -> list[float]:
    """`parse_and_normalize_split`: the numbers of `split` ("99,1,0"), three of them, summing to 1."""
    parts = [float(x) for x in re.findall(r"[.0-9]+", split)]
    parts += [0.0] * (3 - len(parts))
    if len(parts) != 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise ConfigError(f"--split {split!r}: expected up to three non-negative weights (train, valid, test)")
    w = np.array(parts, dtype=np.float64)
    return [float(x) for x in (w / w.sum()).tolist()]


def train_documents(num_sequences: int, split: str) -> npt.NDArray[np.int32]:
    """The train split's sequence ids: `arange(round(0 * N), round(split[0] * N))`."""
    train = split_weights(split)[0]
    if train <= 0:
        raise ConfigError(f"--split {split!r} leaves no training data")
    return np.arange(round(0.0 * num_sequences), round(train * float(num_sequences)), dtype=np.int32)


def num_epochs(tokens_per_epoch: int, num_samples: int | None, seq_length: int, add_extra_token: bool) -> int:
    """`GPTDataset._get_num_epochs`."""
    if num_samples is None:
        return 1
    wanted = num_samples * seq_length + int(add_extra_token)
    if tokens_per_epoch <= 0:
        raise ConfigError("the training split holds no tokens")
    epochs, tokens = 1, tokens_per_epoch
    while tokens < wanted:
        epochs += 1
        tokens += tokens_per_epoch
    return epochs


def document_index(documents: npt.NDArray[Any], epochs: int, rng: np.random.RandomState,
                   separate_final_epoch: bool) -> npt.NDArray[np.int32]:
    """`_build_document_index`."""
    if not separate_final_epoch or epochs == 1:
        index = np.mgrid[0:epochs, 0:len(documents)][1]
        index[:] = documents
        out: npt.NDArray[np.int32] = index.reshape(-1).astype(np.int32)
        rng.shuffle(out)
        return out
    first = document_index(documents, epochs - 1, rng, False)
    last = document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def sample_index(sizes: npt.NDArray[np.int32], doc_index: npt.NDArray[np.int32], seq_length: int, epochs: int,
                 tokens_per_epoch: int, drop_last_partial_sequence: bool = True,
                 add_extra_token: bool = True) -> npt.NDArray[Any]:
    """`helpers.cpp::build_sample_idx` (and `helpers.py`'s choice of int32/int64), vectorised.

    Row `i` is (position in `doc_index`, offset) of the document holding the last token of sample `i - 1` —
    the token at `i * seq_length + extra - 1` of the documents laid end to end — and the offset of token
    `i * seq_length` in it; row 0 is (0, 0). A sample that would run past the last document ends there
    (`drop_last_partial_sequence=False`), at offset `size - extra`.
    """
    extra = int(add_extra_token)
    if seq_length <= 1 or epochs <= 0 or tokens_per_epoch <= 1:
        raise ConfigError(f"GPTDataset needs seq_length > 1 and more than one token (seq_length {seq_length}, "
                          f"{tokens_per_epoch} tokens per epoch)")
    total = epochs * tokens_per_epoch - extra
    # with a partial last sample: C++ `ceil(float(x) / seq_length)`, where float is 32-bit
    count = total // seq_length if drop_last_partial_sequence else math.ceil(float(np.float32(total)) / seq_length)
    lengths = sizes[doc_index].astype(np.int64)
    cum = np.concatenate(([0], np.cumsum(lengths)))
    starts = np.arange(1, count + 1, dtype=np.int64) * seq_length
    last_token = starts + extra - 1
    past_end = last_token >= cum[-1]
    pos = np.minimum(np.searchsorted(cum, last_token, side="right") - 1, len(doc_index) - 1)
    offset = starts - cum[pos]
    if past_end.any():  # the partial last sample (drop_last_partial_sequence=False)
        offset[past_end] = lengths[-1] - extra
    wide = max(int(doc_index.shape[0]), int(sizes.max()) if sizes.size else 0) > np.iinfo(np.int32).max
    out = np.zeros((count + 1, 2), dtype=np.int64 if wide else np.int32)
    out[1:, 0] = pos
    out[1:, 1] = offset
    return out


def shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> npt.NDArray[Any]:
    """`_build_shuffle_index`."""
    dtype: type[np.number[Any]] = np.int64 if total_size >= np.iinfo(np.uint32).max - 1 else np.uint32
    first = np.arange(0, num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


@dataclass(frozen=True, slots=True)
class GPTIndices:
    """The three indices of one `GPTDataset` split, and how they were built."""

    document_index: npt.NDArray[np.int32]
    sample_index: npt.NDArray[Any]
    shuffle_index: npt.NDArray[Any]
    num_epochs: int
    separate_final_epoch: bool
    add_extra_token: bool
    seq_length: int

    def __len__(self) -> int:
        return int(self.sample_index.shape[0]) - 1


def build_indices(sizes: npt.NDArray[np.int32], documents: npt.NDArray[Any], *, num_samples: int | None,
                  seq_length: int, seed: int, add_extra_token: bool = True,
                  drop_last_partial_sequence: bool = True) -> GPTIndices:
    """`GPTDataset._build_document_sample_shuffle_indices` for the sequences `documents` of a dataset whose
    sequence lengths are `sizes`."""
    extra = int(add_extra_token)
    tokens_per_epoch = int(np.sum(sizes[documents]))
    epochs = num_epochs(tokens_per_epoch, num_samples, seq_length, add_extra_token)
    separate = False
    sans_final = 0
    if epochs > 1:
        assert num_samples is not None
        sans_final = ((epochs - 1) * tokens_per_epoch - extra) // seq_length
        from_final = num_samples - sans_final
        per_epoch = (tokens_per_epoch - extra) // seq_length
        if not 0 <= from_final <= per_epoch + 1:  # megatron-core asserts both
            raise ConfigError(f"GPTDataset: {from_final} samples from the final epoch (per epoch {per_epoch})")
        separate = from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
    rng = np.random.RandomState(seed)
    doc_index = document_index(documents, epochs, rng, separate)
    samples = sample_index(sizes, doc_index, seq_length, epochs, tokens_per_epoch, drop_last_partial_sequence,
                           add_extra_token)
    total = samples.shape[0] - 1
    shuffled = shuffle_index(sans_final if separate else total, total, rng)
    return GPTIndices(doc_index, samples, shuffled, epochs, separate, add_extra_token, seq_length)


def sample_tokens(dataset: IndexedDataset, indices: GPTIndices, idx: int) -> npt.NDArray[np.int64]:
    """The `seq_length + add_extra_token` token ids of training sample `idx`
    (`GPTDataset._query_document_sample_shuffle_indices`; padded with -1 past the data's end)."""
    extra = int(indices.add_extra_token)
    row = int(indices.shuffle_index[idx])
    beg, beg_off = (int(x) for x in indices.sample_index[row])
    end, end_off = (int(x) for x in indices.sample_index[row + 1])
    doc = indices.document_index
    if beg == end:
        parts = [dataset.get(int(doc[beg]), beg_off, end_off - beg_off + extra)]
    else:
        parts = [dataset.get(int(doc[i]), beg_off if i == beg else 0, None if i < end else end_off + extra)
                 for i in range(beg, end + 1)]
    text = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    want = indices.seq_length + extra
    if text.shape[0] < want:
        text = np.concatenate((text, np.full(want - text.shape[0], PAD_TOKEN_ID, dtype=np.int64)))
    return text
