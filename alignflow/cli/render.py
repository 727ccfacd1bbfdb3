"""`alignflow render EXPERIMENT [STEP] [--hosts F] [--set NAME=VALUE] [--script] [--json]`.

Without a step: the experiment's pipeline as derived from its checkpoint formats (which conversion steps it has, what
each training loads). With one: the exact command, environment and config files that step would run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("render")
    def render_cmd(
        experiment: str = typer.Argument(..., help="Experiment file, or a name under experiments/."),
        step: str | None = typer.Argument(None, help="A step that runs a command: a training (npu_base_train, "
                                          "gpu_train, npu_reload_train) or a conversion (convert_bf16, "
                                          "convert_<format>); left out: the experiment's steps."),
        hosts: Path | None = typer.Option(None, "--hosts", help="Inventory: the step's host, its python, env and "
                                          "setup lines, where the data is staged; GPU kernels per cuda_extensions."),
        values: list[str] = typer.Option([], "--set", help="Fill a placeholder: out=DIR, in:NAME=PATH, python=EXE "
                                         "(repeatable)."),
        script: bool = typer.Option(False, "--script", help="Print a bash script that runs the step as the "
                                    "transport would (files written, env exported, cwd {out})."),
        as_json: bool = typer.Option(False, "--json", help="Print argv, env, files and host as JSON."),
    ) -> None:
        """Print the exact command, environment and config files a step would run, as the run renders them (or,
        without a step, the experiment's pipeline derived from its checkpoint formats).

        Exit 0 printed, 2 on a usage or configuration error.
        """
        from alignflow.cli.show import resolve_experiment
        from alignflow.config import load_experiment, load_hosts
        from alignflow.errors import ConfigError
        from alignflow.step_render import pipeline_view, render_step

        filled: dict[str, str] = {}
        for item in values:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"render: --set {item!r}: expected NAME=VALUE")
            filled[key] = value
        path = resolve_experiment(experiment)
        inventory = load_hosts(hosts) if hosts is not None else None
        exp = load_experiment(path, inventory)
        if step is None:
            view = pipeline_view(exp)
            typer.echo(json.dumps(view.to_json(), indent=1) if as_json else view.text(), nl=not as_json)
            return
        rendered = render_step(exp, step, inventory=inventory, values=filled)
        if as_json:
            out = asdict(rendered)
            out["host"] = rendered.host.name if rendered.host else None
            typer.echo(json.dumps(out, indent=1))
        else:
            typer.echo(rendered.script() if script else rendered.text(), nl=False)
