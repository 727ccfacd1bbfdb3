"""`alignflow convert bf16|megatron|mindformers|specs`: checkpoint conversion from the command line.

Exit codes: 0 converted; 1 the checkpoint does not convert (every problem printed, nothing written); 2 bad
arguments (unknown spec, flavour the spec does not write, malformed version, missing source).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from alignflow.errors import ConfigError, ConversionError

if TYPE_CHECKING:
    from alignflow.convert import ConversionSummary

PROGRESS_MIN_BYTES = 64 * 1024 * 1024  # smaller conversions finish before a bar is worth drawing


class FlavorChoice(StrEnum):
    local = "local"
    te = "te"


def _version(value: str) -> str:
    from alignflow.convert.plan import parse_version

    try:
        parse_version(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


@contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr, drawn only for conversions of at least PROGRESS_MIN_BYTES.

    It is also where Ctrl-C takes effect: a KeyboardInterrupt raised inside torch or safetensors while they read a
    tensor comes out as an unrelated `ValueError` traceback (issue 16), so the first SIGINT is held until the
    next tensor is done (a second one interrupts at once); the staged output is then removed as for any failure.
    """
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    state: dict[str, Any] = {}
    interrupted: list[int] = []

    def hold(signum: int, frame: object) -> None:
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(signum)

    def update(done: int, total: int) -> None:
        if interrupted:
            raise KeyboardInterrupt
        if total < PROGRESS_MIN_BYTES:
            return
        if "task" not in state:
            bar.start()
            state["task"] = bar.add_task(label, total=total)
        bar.update(state["task"], completed=done)

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, hold) if main else None
    try:
        yield update
        if interrupted:
            raise KeyboardInterrupt
    finally:
        if main:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
        if "task" in state:
            bar.stop()


def _report(summary: ConversionSummary, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(summary.to_json(), indent=2))
        return
    extra = f", {summary.extra_state_keys} _extra_state" if summary.extra_state_keys else ""
    typer.echo(f"{summary.kind}: {summary.tensors} tensors{extra}, {summary.bytes / 2**20:.1f} MiB -> "
               f"{summary.destination} ({summary.seconds:.2f} s)")
    if summary.dropped:
        shown = ", ".join(summary.dropped[:8]) + (" ..." if len(summary.dropped) > 8 else "")
        typer.echo(f"dropped {len(summary.dropped)}: {shown}")
    for note in summary.notes:
        typer.echo(f"note: {note}")


def _run(call: Callable[[], ConversionSummary], as_json: bool) -> None:
    try:
        summary = call()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except ConversionError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    _report(summary, as_json)


_SRC = typer.Argument(..., exists=True, help="Source checkpoint (directory or file).")
_DST = typer.Argument(..., help="Destination directory; must not exist.")
_JSON = typer.Option(False, "--json", help="Print the conversion summary as JSON.")
_SPEC = typer.Option(..., "--spec", help="Conversion spec name (`alignflow convert specs`) or spec file.")
_FLAVOR = typer.Option(FlavorChoice.local, "--flavor", help="Megatron --transformer-impl: local or te.")
_VERSION = typer.Option("0.16", "--megatron-version", callback=_version,
                        help="megatron-core version of the GPU side (MTP inner layer name changes in 0.17).")
_MODEL = typer.Option(None, "--model", exists=True,
                      help="Model dimensions: a JSON/YAML model section or an experiment file (default: the spec's).")


def _model(path: Path | None) -> Any:
    """The `ModelConfig` of `--model`: a bare model section (JSON or YAML) or a whole experiment file."""
    if path is None:
        return None
    from alignflow.config.model import ModelConfig
    from alignflow.config.yamlsource import load_yaml, validate

    doc = load_yaml(path)  # JSON is YAML
    if isinstance(doc.data, dict) and "model" in doc.data and "family" not in doc.data:
        from alignflow.config.experiment import load_experiment

        return load_experiment(path).model
    return validate(ModelConfig, doc)


def register(app: typer.Typer) -> None:
    convert_app = typer.Typer(help="Convert checkpoints: bf16, MindFormers <-> Megatron (declarative, fail-closed).",
                              no_args_is_help=True)
    app.add_typer(convert_app, name="convert")

    @convert_app.command("bf16")
    def bf16_cmd(src: Path = _SRC, dst: Path = _DST, as_json: bool = _JSON) -> None:
        """MindFormers checkpoint -> bf16 MindFormers checkpoint (optimizer state and counters dropped)."""
        from alignflow.convert import convert_bf16

        with _progress("bf16") as progress:
            _run(lambda: convert_bf16(src, dst, progress=progress), as_json)

    @convert_app.command("megatron")
    def megatron_cmd(
        src: Path = _SRC, dst: Path = _DST, spec: str = _SPEC, flavor: FlavorChoice = _FLAVOR,
        megatron_version: str = _VERSION,
        iteration: int = typer.Option(1, "--iteration", min=0, help="Iteration written into the checkpoint."),
        skeleton: Path | None = typer.Option(None, "--skeleton", exists=True,
                                             help="A Megatron-saved checkpoint of the target model: its key set, "
                                                  "shapes, dtypes and _extra_state entries become the contract."),
        model: Path | None = _MODEL,
        as_json: bool = _JSON,
    ) -> None:
        """bf16 MindFormers checkpoint -> Megatron legacy checkpoint (iter_N/mp_rank_00/model_optim_rng.pt)."""
        from alignflow.convert import convert_to_megatron

        with _progress("megatron") as progress:
            _run(lambda: convert_to_megatron(src, dst, spec=spec, flavor=flavor.value,
                                             model=_model(model), megatron_version=megatron_version,
                                             iteration=iteration, progress=progress, skeleton=skeleton), as_json)

    @convert_app.command("mindformers")
    def mindformers_cmd(
        src: Path = _SRC, dst: Path = _DST, spec: str = _SPEC, flavor: FlavorChoice = _FLAVOR,
        megatron_version: str = _VERSION,
        iteration: int | None = typer.Option(None, "--iteration", min=0,
                                             help="Iteration of the output; default: the Megatron checkpoint's."),
        prefix: str = typer.Option("checkpoint", "--prefix", help="File prefix: <prefix>-model-0000000-0000001."),
        model: Path | None = _MODEL,
        as_json: bool = _JSON,
    ) -> None:
        """Megatron legacy checkpoint -> bf16 MindFormers checkpoint (the spec's inverse)."""
        from alignflow.convert import convert_to_mindformers

        with _progress("mindformers") as progress:
            _run(lambda: convert_to_mindformers(src, dst, spec=spec, flavor=flavor.value,
                                                model=_model(model), megatron_version=megatron_version,
                                                iteration=iteration,
                                                prefix=prefix, progress=progress), as_json)

    @convert_app.command("specs")
    def specs_cmd(as_json: bool = typer.Option(False, "--json", help="Print the specs as JSON.")) -> None:
        """List the conversion specs, their flavours and Megatron tensor counts for their default model."""
        from alignflow.convert import list_specs

        infos = list_specs()
        if as_json:
            typer.echo(json.dumps([i.to_json() for i in infos], indent=2))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table("spec", "flavours", "Megatron tensors", "description")
        for info in infos:
            counts = ", ".join(f"{f}: {n}" for f, n in info.target_tensors)
            table.add_row(info.name, ", ".join(info.flavors), counts, info.description)
        Console().print(table)
