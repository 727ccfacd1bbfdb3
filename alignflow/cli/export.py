"""`alignflow export RUN --tensorboard DIR --mlflow URI`: a recorded run where these users already look."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export_cmd(
        run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
        tensorboard: Path | None = typer.Option(None, "--tensorboard", help="TensorBoard log dir: the run is written "
                                                "as DIR/<run id>/, both sides' metrics as scalars."),
        mlflow: str | None = typer.Option(None, "--mlflow", help="MLflow tracking URI (e.g. sqlite:///mlflow.db, "
                                          "http://host:5000): one MLflow run per side."),
    ) -> None:
        """Export a run's curves (both sides), criteria and fingerprints to TensorBoard and/or MLflow."""
        from alignflow.export import export_run
        from alignflow.state import database_url
        from alignflow.store import Store, database

        if tensorboard is None and not mlflow:
            typer.echo("error: export: name a target: --tensorboard DIR and/or --mlflow URI", err=True)
            raise typer.Exit(2)
        url = database_url()
        missing = database.missing_sqlite_file(url)
        if missing is not None:
            typer.echo(f"error: no store at {missing}; nothing has been recorded yet", err=True)
            raise typer.Exit(1)
        with Store.open(url) as store:
            for line in export_run(store, run_id, tensorboard=tensorboard, mlflow=mlflow):
                typer.echo(line)
