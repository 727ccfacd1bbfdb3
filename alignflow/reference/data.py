"""The twin's token data: one file both sides read, the same samples in the same order from a seed.

Format: a NumPy `.npy` file (no pickle) holding one 1-D `uint16` array of token ids — a single self-describing
file that MindSpore and PyTorch hosts read with nothing but numpy, memory-mapped. Its sha256 is the data
fingerprint that both entry points check against the declared one (seed 000 §3.5: both sides must prove they
read the same bytes).

Samples follow Megatron's `GPTDataset` for one unsegmented document: sample `i` is the `seq_length + 1` tokens
starting at `i * seq_length` (consecutive samples share one token; input = sample[:-1], labels = sample[1:]),
and the order is `numpy.random.RandomState(seed).shuffle` of the sample index (seed 001 §10.1: a different
seed on one side reads different samples). Batch `k` is samples `order[k*GBS:(k+1)*GBS]`, byte-identical on
both sides.

The synthetic generator writes text with structure a small model learns within tens of steps: a sparse
first-order Markov chain (each token has four likely successors) interleaved with copies of the token eight
positions back (something only attention can predict), cut into documents that end with an end-of-document
token (the last id of the vocabulary, as Megatron's `NullTokenizer` places it).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from alignflow.errors import ConfigError, FingerprintMismatch
from alignflow.fingerprint import sha256_file_uncached

TOKEN_DTYPE = np.uint16
_SUCCESSORS = 4
_COPY_PROB = 0.15
_COPY_DISTANCE = 8
_MEAN_DOC_TOKENS = 512


def generate_tokens(num_tokens: int, seed: int, vocab_size: int = 256) -> npt.NDArray[np.uint16]:
    """Synthetic token stream (pure: the same arguments give the same array on every machine)."""
    if num_tokens < 2:
        raise ConfigError(f"make-data: --tokens must be at least 2, got {num_tokens}")
    if not 8 <= vocab_size <= np.iinfo(TOKEN_DTYPE).max + 1:
        raise ConfigError(f"make-data: vocab size must be within 8..65536, got {vocab_size}")
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


def write_tokens(path: str | Path, tokens: npt.NDArray[Any]) -> str:
    """Write `tokens` as `.npy` atomically (temporary file, then rename); return the file's sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE), allow_pickle=False)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the data file is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sha256_file_uncached(path)


def make_data(path: str | Path, num_tokens: int, seed: int, vocab_size: int = 256) -> str:
    """Generate and write a data file; return its sha256 (`alignflow reference make-data`)."""
    return write_tokens(path, generate_tokens(num_tokens, seed, vocab_size))


@dataclass(frozen=True, slots=True)
class TokenData:
    """A loaded, verified data file and the shuffled sample order both sides read from."""

    path: Path
    sha256: str
    tokens: npt.NDArray[np.uint16]
    seq_length: int
    order: npt.NDArray[np.uint32]

    @property
    def num_samples(self) -> int:
        return int(self.order.shape[0])

    def batch(self, step: int, global_batch_size: int) -> npt.NDArray[np.int64]:
        """Samples of 0-based step `step`: int64 `[GBS, seq_length + 1]` (inputs `[:, :-1]`, labels `[:, 1:]`)."""
        ids = self.order[step * global_batch_size : (step + 1) * global_batch_size]
        starts = ids.astype(np.int64) * self.seq_length
        window = np.arange(self.seq_length + 1, dtype=np.int64)
        return np.asarray(self.tokens[starts[:, None] + window[None, :]], dtype=np.int64)


def shuffle_index(num_samples: int, seed: int) -> npt.NDArray[np.uint32]:
    """Megatron `GPTDataset` shuffle index for one epoch: `RandomState(seed).shuffle(arange(n, dtype=uint32))`."""
    index = np.arange(num_samples, dtype=np.uint32)
    np.random.RandomState(seed).shuffle(index)
    return index


def load_data(
    path: str | Path,
    *,
    seq_length: int,
    seed: int,
    vocab_size: int,
    samples_needed: int,
    expected_sha256: str | None,
    where: str,
) -> TokenData:
    """Open a data file, check its declared sha256, its ids and its size; fail closed with `where` named."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{where}: data file {str(path)!r} does not exist; make one with "
                          "`alignflow reference make-data OUT --tokens N --seed S`")
    digest = sha256_file_uncached(path)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise FingerprintMismatch(
            f"{where}: data file {str(path)!r} has sha256 {digest}, but {expected_sha256.lower()} was declared; "
            "both sides must read the same bytes", expected=expected_sha256.lower(), actual=digest)
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{where}: {str(path)!r} is not a twin token file (.npy of uint16): {exc}") from None
    if tokens.ndim != 1 or tokens.dtype != TOKEN_DTYPE:
        raise ConfigError(f"{where}: {str(path)!r} holds {tokens.dtype} {tokens.shape}; expected 1-D uint16")
    top = int(tokens.max()) if tokens.size else 0
    if top >= vocab_size:
        raise ConfigError(f"{where}: {str(path)!r} contains token id {top} >= vocabulary size {vocab_size}")
    num_samples = max((int(tokens.shape[0]) - 1) // seq_length, 0)
    if num_samples < samples_needed:
        raise ConfigError(
            f"{where}: {str(path)!r} has {tokens.shape[0]} tokens = {num_samples} samples of {seq_length}+1 tokens, "
            f"but the run needs {samples_needed}; make a larger file (--tokens {samples_needed * seq_length + 1} "
            "or more)")
    return TokenData(path=path, sha256=digest, tokens=tokens, seq_length=seq_length,
                     order=shuffle_index(num_samples, seed))
