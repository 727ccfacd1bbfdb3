"""`alignflow data make|inspect`: an experiment's data, a Megatron indexed dataset (`<prefix>.bin` + `.idx`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

data_app = typer.Typer(help="Experiment data: Megatron indexed datasets (<prefix>.bin + <prefix>.idx).",
                       no_args_is_help=True)


@data_app.command("make")
def make_cmd(
    prefix: Path = typer.Argument(..., help="Dataset prefix: writes PREFIX.bin and PREFIX.idx (never overwritten)."),
    tokens: int | None = typer.Option(None, "--tokens", min=2, help="Generate this many synthetic tokens."),
    seed: int = typer.Option(0, "--seed", min=0, help="Generator seed."),
    vocab_size: int = typer.Option(256, "--vocab-size", min=8, max=65499,
                                   help="Vocabulary; its last id ends a document (Megatron's NullTokenizer EOD)."),
    from_npy: Path | None = typer.Option(None, "--from-npy", help="Convert a 1-D .npy of token ids instead (cut "
                                         "into documents after each end-of-document id)."),
) -> None:
    """Write an indexed dataset (synthetic, or converted from a .npy token file); print its sha256.

    Exit 0 written, 2 on a usage or configuration error.
    """
    import numpy as np

    from alignflow.errors import ConfigError
    from alignflow.twin.data import make_data, split_documents, write_documents

    if (tokens is None) == (from_npy is None):
        raise ConfigError("data make: give exactly one of --tokens N (synthetic) or --from-npy FILE")
    if from_npy is not None:
        try:
            array = np.load(from_npy, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"data make: {from_npy} is not a .npy array: {exc}") from None
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ConfigError(f"data make: {from_npy} holds {array.dtype} {array.shape}; expected 1-D token ids")
        if array.size and int(array.max()) >= vocab_size:
            raise ConfigError(f"data make: {from_npy} has token id {int(array.max())} >= --vocab-size {vocab_size}")
        digest = write_documents(prefix, split_documents(array, vocab_size - 1), vocab_size)
    else:
        assert tokens is not None
        digest = make_data(prefix, tokens, seed, vocab_size)
    typer.echo(f"{digest}  {prefix}")


@data_app.command("inspect")
def inspect_cmd(
    prefix: Path = typer.Argument(..., help="Dataset prefix (PREFIX.bin + PREFIX.idx)."),
    seed: int = typer.Option(1234, "--seed", help="Data-order seed (Megatron --seed)."),
    seq_length: int = typer.Option(32, "--seq-length", min=2, help="Sequence length (Megatron --seq-length)."),
    global_batch_size: int = typer.Option(4, "--global-batch-size", min=1, help="Samples in the first batch."),
    steps: int = typer.Option(1, "--steps", min=1, help="Training steps (the sample count is steps x batch)."),
    split: str = typer.Option("100,0,0", "--split", help="Megatron --split; the train split is read."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Documents, tokens, dtype, sha256, and the first batch's token ids in GPTDataset order for a seed.

    Exit 0, 1 when the dataset cannot be read, 2 on a usage or configuration error.
    """
    from alignflow.datasets.indexed import open_indexed
    from alignflow.twin.data import data_sha256, load_data

    dataset = open_indexed(prefix, where="data inspect")
    data = load_data(prefix, seq_length=seq_length, seed=seed, vocab_size=1 << 31,
                     samples_needed=steps * global_batch_size, expected_sha256=None, where="data inspect",
                     split=split)
    first = data.batch(0, global_batch_size)
    report = {
        "prefix": str(prefix), "sha256": data_sha256(prefix), "dtype": dataset.dtype.name,
        "documents": int(len(dataset.document_indices) - 1), "sequences": len(dataset),
        "tokens": dataset.num_tokens,
        "min_id": int(dataset.tokens.min()) if dataset.num_tokens else None,
        "max_id": int(dataset.tokens.max()) if dataset.num_tokens else None,
        "order": {"seed": seed, "seq_length": seq_length, "split": split, "samples": steps * global_batch_size,
                  "epochs": data.indices.num_epochs, "separate_final_epoch": data.indices.separate_final_epoch},
        "first_batch": first.tolist(),
    }
    if as_json:
        typer.echo(json.dumps(report, indent=1))
        return
    for key in ("prefix", "sha256", "dtype", "documents", "sequences", "tokens", "min_id", "max_id"):
        typer.echo(f"{key:10} {report[key]}")
    order = report["order"]
    typer.echo(f"order      GPTDataset seed {seed}, seq_length {seq_length}, split {split}: {order['samples']} "
               f"samples, {order['epochs']} epoch(s)")
    for i, row in enumerate(first.tolist()):
        typer.echo(f"batch 1 sample {i}: {' '.join(str(t) for t in row)}")


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
