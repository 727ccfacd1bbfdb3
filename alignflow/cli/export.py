"""`alignflow export RUN --tensorboard DIR --mlflow [--mlflow-uri URI]`: a recorded run where these users already
look."""

from __future__ import annotations

import os
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export_cmd(
        run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
        tensorboard: Path | None = typer.Option(None, "--tensorboard", help="TensorBoard log dir: the run is written "
                                                "as DIR/<run id>/ with one TensorBoard run per side (NPU/, GPU/) "
                                                "and one of the per-step error (error/)."),
        mlflow: bool = typer.Option(False, "--mlflow", help="Export to MLflow: a parent run (parameters, criteria, "
                                    "the report as artifacts) and one child run per side (per-step metrics)."),
        mlflow_uri: str | None = typer.Option(None, "--mlflow-uri", help="MLflow tracking URI (http://HOST:5000, "
                                              "sqlite:///PATH/mlflow.db). Default: $MLFLOW_TRACKING_URI, else "
                                              "<state dir>/mlflow/mlflow.db."),
    ) -> None:
        """Export a run's curves (both sides), criteria, parameters, fingerprints and report to TensorBoard and/or
        MLflow.

        Exit 0 exported, 1 when an export fails, 2 on a usage or configuration error (no target given, RUN unknown).
        """
        from alignflow.export import check_mlflow_uri, default_mlflow_uri, export_run
        from alignflow.state import database_url, state_dir
        from alignflow.store import Store, database

        if mlflow_uri and not mlflow:
            mlflow = True  # naming where to export is asking to export there
        if tensorboard is None and not mlflow:
            typer.echo("error: export: name a target: --tensorboard DIR and/or --mlflow [--mlflow-uri URI]", err=True)
            raise typer.Exit(2)
        uri = None
        if mlflow:
            uri = check_mlflow_uri(mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
                                   or default_mlflow_uri(state_dir()))
        url = database_url()
        missing = database.missing_sqlite_file(url)
        if missing is not None:
            typer.echo(f"error: no store at {missing}; nothing has been recorded yet", err=True)
            raise typer.Exit(1)
        from alignflow.staging import Interrupted, held_interruptions

        interrupted: Interrupted | None = None
        with held_interruptions() as held:
            try:
                with Store.open(url) as store:
                    for line in export_run(store, run_id, tensorboard=tensorboard, mlflow=uri):
                        typer.echo(line)
            except Interrupted as exc:
                interrupted = exc
        # Each target is whole or absent (alignflow.export): say which one an interruption left out.
        done = [f"tensorboard: {t}" for t in held.completed if isinstance(t, Path)]
        done += [str(t) for t in held.completed if isinstance(t, str)]
        if interrupted is not None:
            kept = f"; completed before it: {', '.join(done)}" if done else ""
            typer.echo(f"interrupted ({interrupted}): the export did not complete; nothing partial was left{kept}",
                       err=True)
            raise typer.Exit(interrupted.exit_code)
        if held.received:
            typer.echo(f"{held.signal_name} received after the export completed: it is whole", err=True)
