"""The lab's data: the twin's synthetic tokens as one Megatron indexed dataset document (`<prefix>.bin/.idx`).

    python -m alignflow.labs.mindformers_cpu.data OUT_DIR [--prefix P] [--tokens N] [--seed S]

MindFormers' `BlendedMegatronDatasetDataLoader` reads only indexed datasets; they are written with
megatron-core's own `IndexedDatasetBuilder` (uint16, one `add_document` of the whole array, then `finalize`), as
Megatron's `tools/preprocess_data.py` writes them. Deterministic: the same arguments give the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

DEFAULT_PREFIX = "qwen3_text_document"


def write_indexed(out_dir: Path, prefix: str, *, tokens: int, seed: int, vocab_size: int = 256) -> Path:
    """Write `<out_dir>/<prefix>.bin/.idx` (one document); return the prefix path."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from alignflow.twin.data import generate_tokens

    array = generate_tokens(tokens, seed, vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / prefix
    tmp = out_dir / f".{prefix}.partial"
    builder = IndexedDatasetBuilder(f"{tmp}.bin", dtype=np.uint16)
    builder.add_document(torch.from_numpy(array.astype(np.int64)), [len(array)])
    builder.finalize(f"{tmp}.idx")
    Path(f"{tmp}.bin").replace(f"{path}.bin")
    Path(f"{tmp}.idx").replace(f"{path}.idx")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignflow.labs.mindformers_cpu.data")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    write_indexed(args.out_dir, args.prefix, tokens=args.tokens, seed=args.seed)
    from alignflow.fingerprint import sha256_of

    sys.stdout.write(sha256_of(args.out_dir) + "\n")  # the value for the experiment's data.sha256
    return 0


if __name__ == "__main__":
    sys.exit(main())
