"""An experiment's token data: a Megatron indexed dataset, generated, fingerprinted and read in GPTDataset order.

Format: `<dir>/<prefix>.bin` + `<dir>/<prefix>.idx`, megatron-core's indexed dataset (`alignflow.datasets.indexed`),
one sequence per document, uint16 ids below 65500 (what `tools/preprocess_data.py` writes). Real Megatron-LM
(`--data-path <dir>/<prefix>`), MindFormers' GPTDataset port and both twin sides read these same two files.

Fingerprint: the data's sha256 is the digest of the canonical manifest of exactly those two files
(`alignflow.fingerprint.canonical_manifest`), which is the directory's fingerprint when the directory holds them
alone — as the pipeline's data directory must, so that what the runner hashes and moves is what the trainings
check (both sides must prove they read the same bytes).

Order: megatron-core `GPTDataset` (`alignflow.datasets.gpt`) for the experiment's seed, sequence length, split and
`train_iters x global_batch_size` samples; batch `k` is training samples `k*GBS .. (k+1)*GBS - 1`, each
`seq_length + 1` tokens (input = sample[:-1], labels = sample[1:]), token for token what pretrain_gpt.py feeds.

The synthetic generator writes text with structure a small model learns within tens of steps: a sparse first-order
Markov chain (each token has four likely successors) interleaved with copies of the token eight positions back
(something only attention can predict), cut into documents that end with an end-of-document token: the last id of
the vocabulary, where the NullTokenizer flags alignflow renders put EOD for every megatron-core version
(`alignflow.backends.megatron.megatron_vocab_flags`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from alignflow.datasets.gpt import GPTIndices, build_indices, sample_tokens, train_documents
from alignflow.datasets.indexed import IndexedDataset, bin_path, idx_path, open_indexed, optimal_dtype, write_indexed
from alignflow.errors import ConfigError, FingerprintMismatch
from alignflow.fingerprint import FileEntry, canonical_manifest, sha256_file_uncached

TOKEN_DTYPE = np.uint16
_SUCCESSORS = 4
_COPY_PROB = 0.15
_COPY_DISTANCE = 8
_MEAN_DOC_TOKENS = 512


def generate_tokens(num_tokens: int, seed: int, vocab_size: int = 256) -> npt.NDArray[np.uint16]:
    """Synthetic token stream (pure: the same arguments give the same array on every machine)."""
    if num_tokens < 2:
        raise ConfigError(f"data make: --tokens must be at least 2, got {num_tokens}")
    if not 8 <= vocab_size < 65500:
        raise ConfigError(f"data make: vocab size must be within 8..65499 (uint16 ids), got {vocab_size}")
    rng = np.random.RandomState(seed)
    eod = vocab_size - 1
    content = vocab_size - 1  # ids 0..V-2 are content, V-1 ends a document
    successors = rng.randint(0, content, size=(content, _SUCCESSORS))
    weights = rng.dirichlet(np.full(_SUCCESSORS, 0.5), size=content)
    cumulative = np.cumsum(weights, axis=1)
    choice_u = rng.random_sample(num_tokens)
    copy_u = rng.random_sample(num_tokens)
    doc_u = rng.random_sample(num_tokens)
    out = np.empty(num_tokens, dtype=np.int64)
    out[0] = rng.randint(0, content)
    for i in range(1, num_tokens):
        prev = int(out[i - 1])
        if prev == eod:
            out[i] = successors[i % content, 0]
        elif doc_u[i] < 1.0 / _MEAN_DOC_TOKENS:
            out[i] = eod
        elif i > _COPY_DISTANCE and copy_u[i] < _COPY_PROB and out[i - _COPY_DISTANCE] != eod:
            out[i] = out[i - _COPY_DISTANCE]
        else:
            out[i] = successors[prev, int(np.searchsorted(cumulative[prev], choice_u[i] * cumulative[prev, -1]))]
    return out.astype(TOKEN_DTYPE)


def split_documents(tokens: npt.NDArray[Any], eod: int) -> list[npt.NDArray[Any]]:
    """Documents of a token stream: each ends with (and includes) `eod`; a tail without one is the last document."""
    ends = np.flatnonzero(np.asarray(tokens) == eod) + 1
    bounds = [0, *ends.tolist()]
    if bounds[-1] != len(tokens):
        bounds.append(len(tokens))
    return [tokens[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def data_sha256(prefix: str | Path) -> str:
    """The data fingerprint: the manifest digest of `<prefix>.bin` and `<prefix>.idx` (their directory's
    fingerprint when it holds nothing else)."""
    import hashlib

    files = (bin_path(prefix), idx_path(prefix))
    entries = [FileEntry(p.name, sha256_file_uncached(p), p.stat().st_size) for p in files]
    return hashlib.sha256(canonical_manifest(entries)).hexdigest()


def write_documents(prefix: str | Path, documents: list[npt.NDArray[Any]], vocab_size: int) -> str:
    """Write `documents` as an indexed dataset (dtype from the vocabulary); return its fingerprint."""
    write_indexed(prefix, documents, dtype=optimal_dtype(vocab_size))
    return data_sha256(prefix)


def make_data(prefix: str | Path, num_tokens: int, seed: int, vocab_size: int = 256, *,
              one_document: bool = False) -> str:
    """Generate synthetic data and write it as `<prefix>.bin/.idx`; return its fingerprint (`alignflow data make`).
    `one_document`: the stream is one document, not split at the last token id."""
    tokens = generate_tokens(num_tokens, seed, vocab_size)
    documents = [tokens] if one_document else split_documents(tokens, vocab_size - 1)
    return write_documents(prefix, documents, vocab_size)


def check_data_dir(directory: Path, prefix: str, *, where: str) -> None:
    """An experiment's data directory holds `<prefix>.bin` and `<prefix>.idx` and nothing else (the runner
    fingerprints and moves the whole directory; the trainings check the two files)."""
    open_indexed(directory / prefix, where=where)
    extra = sorted(p.name for p in directory.iterdir() if p.name not in (f"{prefix}.bin", f"{prefix}.idx"))
    if extra:
        raise ConfigError(f"{where}: data directory {directory} holds {', '.join(extra)} besides {prefix}.bin and "
                          f"{prefix}.idx; it must hold the dataset alone (its fingerprint is the data's sha256)")


@dataclass(frozen=True, slots=True)
class TokenData:
    """A loaded, verified indexed dataset and GPTDataset's sample order over it."""

    prefix: Path
    sha256: str
    dataset: IndexedDataset
    indices: GPTIndices

    @property
    def num_samples(self) -> int:
        return len(self.indices)

    def sample(self, idx: int) -> npt.NDArray[np.int64]:
        return sample_tokens(self.dataset, self.indices, idx)

    def batch(self, step: int, global_batch_size: int) -> npt.NDArray[np.int64]:
        """Samples of 0-based step `step`: int64 `[GBS, seq_length + 1]` (inputs `[:, :-1]`, labels `[:, 1:]`)."""
        start = step * global_batch_size
        return np.stack([self.sample(i) for i in range(start, start + global_batch_size)])


def load_data(
    prefix: str | Path,
    *,
    seq_length: int,
    seed: int,
    vocab_size: int,
    samples_needed: int,
    expected_sha256: str | None,
    where: str,
    split: str = "100,0,0",
) -> TokenData:
    """Open `<prefix>.bin/.idx`, check its declared sha256 and its ids, build GPTDataset's indices for
    `samples_needed` training samples; fail closed with `where` named."""
    prefix = Path(prefix)
    dataset = open_indexed(prefix, where=where)
    digest = data_sha256(prefix)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise FingerprintMismatch(
            f"{where}: data {str(prefix)!r} (.bin + .idx) has sha256 {digest}, but {expected_sha256.lower()} was "
            "declared; both sides must read the same bytes", expected=expected_sha256.lower(), actual=digest)
    indices = build_indices(dataset.sequence_lengths, train_documents(len(dataset), split),
                            num_samples=samples_needed, seq_length=seq_length, seed=seed)
    data = TokenData(prefix=prefix, sha256=digest, dataset=dataset, indices=indices)
    top = max((int(data.sample(i).max()) for i in range(samples_needed)), default=0)
    if top >= vocab_size:
        raise ConfigError(f"{where}: data {str(prefix)!r} contains token id {top} >= vocabulary size {vocab_size}")
    return data
