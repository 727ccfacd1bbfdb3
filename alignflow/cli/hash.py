"""`alignflow hash PATH... [--json]`: sha256 of files, manifest digest of directories (memoized)."""

from __future__ import annotations

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
        from alignflow.fingerprint import hash_report

        text, errors = hash_report(paths, as_json=as_json, manifest=manifest, memo_path=memo, use_memo=not no_memo)
        for reason in errors:
            typer.echo(f"error: {reason}", err=True)
        typer.echo(text, nl=False)
        raise typer.Exit(1 if errors else 0)
