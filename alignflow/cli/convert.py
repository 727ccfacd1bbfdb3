"""`alignflow convert bf16|megatron|mindformers|hf|dcp|specs`: checkpoint conversion from the command line.

`convert FORMAT SRC DST --from FORMAT` converts between any two checkpoint formats (`alignflow.convert.formats`):
MindFormers <-> Megatron legacy as before, and Hugging Face safetensors and PyTorch DCP, through Megatron's names.

Exit codes: 0 converted; 1 the checkpoint does not convert (every problem printed, nothing written); 2 bad
arguments (unknown spec, flavour the spec does not write, malformed version, missing source).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from alignflow.errors import ConfigError, ConversionError

if TYPE_CHECKING:
    from alignflow.convert import ConversionSummary
    from alignflow.pipeline import CheckpointFormat

PROGRESS_MIN_BYTES = 64 * 1024 * 1024  # smaller conversions finish before a bar is worth drawing


class FlavorChoice(StrEnum):
    local = "local"
    te = "te"


class CkptFormatChoice(StrEnum):
    torch = "torch"
    torch_dist = "torch_dist"


class FormatChoice(StrEnum):
    mindformers = "mindformers"
    megatron = "megatron"
    torch_dist = "torch_dist"
    hf = "hf"
    dcp = "dcp"


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

    It is also where a held Ctrl-C (or SIGTERM) is taken between tensors (`alignflow.staging.held_interruptions`:
    one raised inside torch or safetensors while they read a tensor would come out as an unrelated `ValueError`
    traceback, issue 16); the staged output is then removed as for any failure.
    """
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from alignflow.staging import check_interrupted

    bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        check_interrupted()
        if total < PROGRESS_MIN_BYTES:
            return
        if "task" not in state:
            bar.start()
            state["task"] = bar.add_task(label, total=total)
        bar.update(state["task"], completed=done)

    try:
        yield update
    finally:
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


def _run(label: str, dst: Path, call: Callable[[Callable[[int, int], None]], ConversionSummary],
         as_json: bool) -> None:
    """Run one conversion with signals held: it ends complete (exit 0, also when a signal came after the rename,
    which is then said) or with nothing at `dst` (1 failed, 2 refused, 130 / 143 interrupted)."""
    from alignflow.staging import Interrupted, held_interruptions

    summary: ConversionSummary | None = None
    failed: tuple[int, str] | None = None
    with held_interruptions() as held:
        try:
            with _progress(label) as progress:
                summary = call(progress)
        except ConfigError as exc:
            failed = 2, f"error: {exc}"
        except ConversionError as exc:
            failed = 1, f"error: {exc}"
        except Interrupted as exc:
            if Path(dst) not in held.completed:
                failed = exc.exit_code, f"interrupted ({exc}): the conversion did not complete; {dst} was not written"
    if failed is not None:
        typer.echo(failed[1], err=True)
        raise typer.Exit(failed[0])
    if summary is not None:
        _report(summary, as_json)
    if held.received:  # the signal came while the result was renamed into place, or after: it is whole
        typer.echo(f"{held.signal_name} received after the conversion completed: {dst} is complete", err=True)


_SRC = typer.Argument(..., exists=True, help="Source checkpoint (directory or file).")
_DST = typer.Argument(..., help="Destination directory; must not exist.")
_JSON = typer.Option(False, "--json", help="Print the conversion summary as JSON.")
_SPEC = typer.Option(..., "--spec", help="Conversion spec name (`alignflow convert specs`) or spec file.")
_FLAVOR = typer.Option(FlavorChoice.local, "--flavor", help="Megatron --transformer-impl: local or te.")
_VERSION = typer.Option("0.16", "--megatron-version", callback=_version,
                        help="megatron-core version of the GPU side (MTP inner layer name changes in 0.17).")
_MODEL = typer.Option(None, "--model", exists=True,
                      help="Model dimensions: a JSON/YAML model section or an experiment file (default: the spec's).")
_SOURCE_DTYPE = typer.Option(None, "--source-dtype", help="Refuse a source tensor of another dtype where no rule "
                             "names one (bfloat16: the bf16 export); default: any, one per rule.")


def _fmt(choice: FormatChoice) -> CheckpointFormat:
    return choice.value


def _from(default: FormatChoice) -> Any:
    return typer.Option(default, "--from", help="Format of the source checkpoint.")


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


_TITLES = {"hf": "Hugging Face safetensors checkpoint (config.json from the source, or from --model)",
           "dcp": "PyTorch DCP checkpoint (torch.distributed.checkpoint)"}


def register(app: typer.Typer) -> None:
    convert_app = typer.Typer(help="Convert checkpoints: bf16, between MindFormers, Megatron, Hugging Face and DCP "
                                   "(declarative, fail-closed).", no_args_is_help=True)
    app.add_typer(convert_app, name="convert")

    @convert_app.command("bf16")
    def bf16_cmd(src: Path = _SRC, dst: Path = _DST, as_json: bool = _JSON,
                 strategy: Path | None = typer.Option(
                     None, "--strategy", exists=True,
                     help="The MindSpore parallel strategy file of a per-rank (rank_*/) checkpoint (default: the one "
                          "in strategy/ beside it).")) -> None:
        """MindFormers checkpoint -> bf16 MindFormers checkpoint (optimizer state and counters dropped).

        Exit 0 converted, 1 when the conversion fails (every problem listed), 2 on a usage or configuration error.
        """
        from alignflow.convert import convert_bf16

        _run("bf16", dst, lambda progress: convert_bf16(src, dst, progress=progress, strategy=strategy), as_json)

    @convert_app.command("megatron")
    def megatron_cmd(
        src: Path = _SRC, dst: Path = _DST, spec: str = _SPEC, flavor: FlavorChoice = _FLAVOR,
        megatron_version: str = _VERSION,
        iteration: int = typer.Option(1, "--iteration", min=0, help="Iteration written into the checkpoint."),
        skeleton: Path | None = typer.Option(None, "--skeleton", exists=True,
                                             help="A Megatron-saved checkpoint of the target model: its key set, "
                                                  "shapes, dtypes and _extra_state entries become the contract."),
        model: Path | None = _MODEL,
        ckpt_format: CkptFormatChoice = typer.Option(
            CkptFormatChoice.torch, "--ckpt-format",
            help="Megatron --ckpt-format: torch (legacy files, one per tp/pp/ep rank) or torch_dist (distributed "
                 "checkpoint through megatron-core's dist_checkpointing; loads at any layout)."),
        tp: int = typer.Option(1, "--tp", min=1, help="Legacy files for this tensor-parallel size."),
        pp: int = typer.Option(1, "--pp", min=1, help="Legacy files for this pipeline-parallel size."),
        ep: int = typer.Option(1, "--ep", min=1, help="Legacy files for this expert-parallel size."),
        workers: int | None = typer.Option(None, "--workers", min=1,
                                           help="torch_dist writer processes (default: one per core)."),
        source: FormatChoice = _from(FormatChoice.mindformers),
        source_dtype: str | None = typer.Option(None, "--source-dtype", help="Refuse a source tensor of another "
                                                "dtype where no rule names one; default: bfloat16 from MindFormers "
                                                "(the bf16 export), any from another format; `any`: one per rule."),
        as_json: bool = _JSON,
    ) -> None:
        """bf16 MindFormers (or Hugging Face, DCP) checkpoint -> Megatron checkpoint: legacy
        (iter_N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt) or, from MindFormers, torch_dist (iter_N/ of
        dist_checkpointing).

        Exit 0 converted, 1 when the conversion fails (every problem listed), 2 on a usage or configuration error.
        """
        from alignflow.config.parallel import ParallelConfig
        from alignflow.convert import convert_to_megatron
        from alignflow.convert.formats import convert_checkpoint

        if ckpt_format is CkptFormatChoice.torch_dist and (tp, pp, ep) != (1, 1, 1):
            typer.echo("error: --tp/--pp/--ep lay out legacy files; a torch_dist checkpoint loads at any layout",
                       err=True)
            raise typer.Exit(2)
        distributed = ckpt_format is CkptFormatChoice.torch_dist or (tp, pp, ep) != (1, 1, 1)
        if distributed and source is not FormatChoice.mindformers:
            typer.echo(f"error: --ckpt-format torch_dist and --tp/--pp/--ep convert from MindFormers; --from "
                       f"{source.value} writes one legacy file", err=True)
            raise typer.Exit(2)
        layout = ParallelConfig(tp=tp, pp=pp, ep=ep, dp=ep)
        dtype = None if source_dtype == "any" else source_dtype or (
            "bfloat16" if source is FormatChoice.mindformers else None)
        if source is FormatChoice.mindformers:
            _run("megatron", dst, lambda progress: convert_to_megatron(
                src, dst, spec=spec, flavor=flavor.value, model=_model(model), megatron_version=megatron_version,
                iteration=iteration, progress=progress, skeleton=skeleton, ckpt_format=ckpt_format.value,
                parallel=layout, workers=workers, source_dtype=dtype), as_json)
        else:
            _run("megatron", dst, lambda progress: convert_checkpoint(
                src, dst, source=_fmt(source), target="megatron", spec=spec, flavor=flavor.value, model=_model(model),
                megatron_version=megatron_version, iteration=iteration, source_dtype=dtype, progress=progress),
                as_json)

    @convert_app.command("mindformers")
    def mindformers_cmd(
        src: Path = _SRC, dst: Path = _DST, spec: str = _SPEC, flavor: FlavorChoice = _FLAVOR,
        megatron_version: str = _VERSION,
        iteration: int | None = typer.Option(None, "--iteration", min=0,
                                             help="Iteration of the output; default: the Megatron checkpoint's."),
        prefix: str = typer.Option("checkpoint", "--prefix", help="File prefix: <prefix>-model-0000000-0000001."),
        model: Path | None = _MODEL,
        source: FormatChoice = _from(FormatChoice.megatron),
        source_dtype: str | None = _SOURCE_DTYPE,
        as_json: bool = _JSON,
    ) -> None:
        """Megatron checkpoint (legacy of one or many ranks, or torch_dist: detected) or Hugging Face / DCP
        checkpoint -> bf16 MindFormers checkpoint (the spec's inverse).

        Exit 0 converted, 1 when the conversion fails (every problem listed), 2 on a usage or configuration error.
        """
        from alignflow.convert import convert_to_mindformers
        from alignflow.convert.formats import convert_checkpoint

        if source in (FormatChoice.megatron, FormatChoice.torch_dist):  # which of them: detected from the files
            _run("mindformers", dst, lambda progress: convert_to_mindformers(
                src, dst, spec=spec, flavor=flavor.value, model=_model(model), megatron_version=megatron_version,
                iteration=iteration, prefix=prefix, progress=progress), as_json)
        else:
            _run("mindformers", dst, lambda progress: convert_checkpoint(
                src, dst, source=_fmt(source), target="mindformers", spec=spec, flavor=flavor.value,
                model=_model(model), megatron_version=megatron_version, iteration=iteration or 1,
                source_dtype=source_dtype, progress=progress), as_json)

    def _other(target: str, default: FormatChoice) -> None:
        @convert_app.command(target, help=f"Any checkpoint -> {_TITLES[target]} (through Megatron's names when the "
                                          "names differ; a copy of every tensor when they do not).\n\nExit 0 "
                                          "converted, 1 when the conversion fails (every problem listed), 2 on a "
                                          "usage or configuration error.")
        def other_cmd(
            src: Path = _SRC, dst: Path = _DST,
            spec: str | None = typer.Option(None, "--spec", help="The model family's conversion spec (needed when "
                                            "the names differ)."),
            flavor: FlavorChoice = _FLAVOR, megatron_version: str = _VERSION,
            iteration: int = typer.Option(1, "--iteration", min=0, help="Iteration of a Megatron source's names."),
            model: Path | None = _MODEL,
            source: FormatChoice = _from(default),
            source_dtype: str | None = _SOURCE_DTYPE,
            as_json: bool = _JSON,
        ) -> None:
            from alignflow.convert.formats import convert_checkpoint

            _run(target, dst, lambda progress: convert_checkpoint(
                src, dst, source=_fmt(source), target=_fmt(FormatChoice(target)), spec=spec, flavor=flavor.value,
                model=_model(model), megatron_version=megatron_version, iteration=iteration,
                source_dtype=source_dtype, progress=progress), as_json)

    _other("hf", FormatChoice.megatron)
    _other("dcp", FormatChoice.hf)

    @convert_app.command("specs")
    def specs_cmd(as_json: bool = typer.Option(False, "--json", help="Print the specs as JSON.")) -> None:
        """List the conversion specs, their flavours and Megatron tensor counts for their default model.

        Exit 0, 2 on a usage or configuration error.
        """
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
