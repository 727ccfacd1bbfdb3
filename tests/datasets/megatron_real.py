"""megatron-core's own dataset code (the `test` extra pins megatron-core 0.16.1; its index code is core 0.19's)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def write_with_megatron(prefix: Path, documents: Sequence[np.ndarray], dtype: Any = np.uint16) -> None:
    """`IndexedDatasetBuilder`, one `add_document` per document, as tools/preprocess_data.py does."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in documents:
        builder.add_document(torch.from_numpy(np.asarray(doc, dtype=np.int64)), [len(doc)])
    builder.finalize(f"{prefix}.idx")


def megatron_gpt_dataset(prefix: Path, *, seed: int, seq_length: int, num_samples: int | None, split: str = "100,0,0",
                         add_extra_token: bool = True, valid: bool = False, drop_last: bool = True,
                         vocab_size: int = 255) -> Any:
    """A real `GPTDataset` over `prefix`: through `BlendedMegatronDatasetBuilder` for the train split (as
    pretrain_gpt.py builds it), or directly for a validation split (`drop_last_partial_validation_sequence`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        from megatron.core.datasets.utils import Split
        from megatron.core.tokenizers import MegatronTokenizer

    tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=vocab_size)
    cache = prefix.parent / f"cache-{seed}-{seq_length}-{num_samples}-{add_extra_token}-{drop_last}"
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=([str(prefix)], None), split=split,
        path_to_cache=str(cache),
        tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        add_extra_token_to_sequence=add_extra_token, drop_last_partial_validation_sequence=drop_last)
    if not valid:
        return BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, 0, 0], lambda: True, config).build()[0]
    low = IndexedDataset(str(prefix), multimodal=False, mmap=True)
    indices = np.arange(len(low.sequence_lengths), dtype=np.int32)
    return GPTDataset(low, str(prefix), indices, num_samples, Split.valid, config)
