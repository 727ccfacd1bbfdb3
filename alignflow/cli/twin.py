"""`alignflow twin ...`: the twin's presets and command-line renderer (its data: `alignflow data make`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer

twin_app = typer.Typer(help="The twin: presets, rendered command lines.", no_args_is_help=True)


@twin_app.command("presets")
def presets_cmd(
    name: str | None = typer.Argument(None, help="Preset to show; default: list them."),
) -> None:
    """List the twin presets, or print one as the `model:` section of an experiment (JSON).

    Exit 0, 2 on a usage or configuration error (an unknown preset).
    """
    from alignflow.twin.presets import DEFAULT_PRESET, PRESETS, preset, twin_spec

    if name is None:
        for key in PRESETS:
            typer.echo(f"{key}{'  (default)' if key == DEFAULT_PRESET else ''}")
        return
    model = preset(name)
    twin_spec(model)
    typer.echo(json.dumps(model.model_dump(exclude_defaults=True), indent=2))


@twin_app.command("render")
def render_cmd(
    name: str = typer.Argument("twin-moe", help="Preset."),
    side: str = typer.Option(..., "--side", help="npu (MindSpore YAML) or gpu (Megatron flags)."),
    data: Path = typer.Option(..., "--data", help="Indexed dataset prefix (PREFIX.bin + PREFIX.idx; its sha256 is "
                              "declared in the output)."),
    steps: int = typer.Option(30, "--steps", min=1, help="Training steps."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Warm-up steps."),
    seed: int = typer.Option(1234, "--seed", min=0, help="Data-order and initialisation seed."),
    global_batch_size: int = typer.Option(4, "--global-batch-size", min=1),
    micro_batch_size: int = typer.Option(4, "--micro-batch-size", min=1),
    load: str | None = typer.Option(None, "--load", help="Checkpoint to start from."),
    save: str | None = typer.Option(None, "--save", help="Checkpoint directory to write."),
    bf16: bool = typer.Option(False, "--bf16", help="bf16 parameter write-back."),
    transformer_impl: str = typer.Option("local", "--transformer-impl", help="local or transformer_engine."),
    megatron_version: str = typer.Option("0.16", "--megatron-version", help="megatron-core version to mimic."),
    out: Path | None = typer.Option(None, "--out", help="Write the YAML here (npu); default stdout."),
) -> None:
    """Render the twin's MindSpore YAML or PyTorch (Megatron) command line for a preset.

    Exit 0, 2 on a usage or configuration error.
    """
    import yaml

    from alignflow.backends.twin import megatron_args
    from alignflow.config.model import TrainingConfig
    from alignflow.datasets.indexed import open_indexed
    from alignflow.errors import ConfigError
    from alignflow.twin.data import data_sha256
    from alignflow.twin.presets import preset
    from alignflow.twin.render import mindformers_config, twin_env

    if side not in ("npu", "gpu"):
        raise ConfigError(f"--side {side!r}: expected npu or gpu")
    if transformer_impl not in ("local", "transformer_engine"):
        raise ConfigError(f"--transformer-impl {transformer_impl!r}: expected local or transformer_engine")
    open_indexed(data, where="twin render --data")
    digest = data_sha256(data)
    training = TrainingConfig(seed=seed, steps=steps, lr=lr, lr_warmup_iters=warmup, bf16=bf16,
                              micro_batch_size=micro_batch_size, global_batch_size=global_batch_size)
    model = preset(name)
    if side == "npu":
        cfg = mindformers_config(model, training, data_path=str(data), data_sha256=digest, load_path=load,
                                 save_path=save, steps=steps)
        text = yaml.safe_dump(cfg, sort_keys=False)
        if out is None:
            typer.echo(text, nl=False)
        else:
            out.write_text(text)
            typer.echo(f"python -m alignflow.twin.mindspore_train --config {shlex.quote(str(out))} --mode 1")
        return
    argv = megatron_args(model, training, data_path=str(data), load=load, save=save,
                         steps=steps, transformer_impl=transformer_impl,  # type: ignore[arg-type]
                         megatron_version=megatron_version)
    env = twin_env(data_sha256=digest, megatron_version=megatron_version)
    typer.echo(shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), "python", "-m",
                           "alignflow.twin.torch_train", *argv]))


def register(app: typer.Typer) -> None:
    app.add_typer(twin_app, name="twin")
