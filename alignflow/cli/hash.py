"""`alignflow hash PATH... [--json]`: sha256 of files, manifest digest of directories (memoized)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("hash")
    def hash_cmd(
        paths: list[str] = typer.Argument(..., help="Files or directories."),
        as_json: bool = typer.Option(
            False, "--json", help='Print {"PATH": "<sha256 hex>"}; a directory\'s value is its manifest digest.'
        ),
        manifest: bool = typer.Option(
            False, "--manifest", help="With --json: kind, size and, for a directory, every file's sha256 and size."
        ),
        memo: Path | None = typer.Option(
            None, "--memo", help="Memo database; default $ALIGNFLOW_HASH_MEMO or ~/.cache/alignflow/hashmemo.sqlite."
        ),
        no_memo: bool = typer.Option(False, "--no-memo", help="Read every byte; neither use nor update the memo."),
    ) -> None:
        """Fingerprint files and directories the way the pipeline does; exit 1 if any path cannot be hashed."""
        from alignflow.fingerprint import Fingerprinter, HashMemo, default_memo_path, fingerprint_paths

        hash_memo = None if no_memo else HashMemo(memo or default_memo_path())
        try:
            results, errors = fingerprint_paths(paths, Fingerprinter(hash_memo))
        finally:
            if hash_memo is not None:
                hash_memo.close()
        for reason in errors.values():
            typer.echo(reason, err=True)
        if as_json:
            payload = {p: (fp.to_json() if manifest else fp.sha256) for p, fp in results.items()}
            typer.echo(json.dumps(payload, indent=None if manifest else 2))
        else:
            for path, fp in results.items():
                typer.echo(f"{fp.sha256}  {path}")
        raise typer.Exit(1 if errors else 0)
