"""`alignflow diagnose RUN`, `diagnose-dumps`, `diagnose-setup` and `noise EXPERIMENT`.

Exit codes: 0 the sides agree (diagnose) / the noise was measured; 1 a divergence was found (the diagnosis is a
verdict, printed with its module and cause); 2 bad input (unknown run, a dump budget refused, a malformed dump).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from alignflow.errors import AlignflowError

if TYPE_CHECKING:
    from alignflow.config.experiment import Experiment

EXIT_PASS, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


def _budget(text: str) -> int:
    units = {"kb": 1e3, "mb": 1e6, "gb": 1e9, "b": 1}
    t = text.strip().lower()
    for unit, factor in units.items():
        if t.endswith(unit):
            try:
                value = float(t[: -len(unit)]) * factor
            except ValueError:
                break
            if value >= 1:
                return int(value)
    if t.isdigit() and int(t) >= 1:
        return int(t)
    raise typer.BadParameter(f"{text!r}: a size such as 2GB, 500MB or a number of bytes")


def _print(result: Any, as_json: bool, seconds: float) -> None:
    """A `DiagnoseResult` of `diagnose-dumps`."""
    _print_doc(result.diagnosis.to_json(), result.json_path, result.html_path, result.dumps, as_json, seconds)


def _print_doc(d: dict[str, Any], json_path: Path, html_path: Path, dumps: dict[str, Path], as_json: bool,
               seconds: float) -> None:
    if as_json:
        typer.echo(json.dumps({**d, "files": {"json": str(json_path), "html": str(html_path),
                                               "dumps": {k: str(v) for k, v in dumps.items()}},
                               "seconds": round(seconds, 1)}, indent=1))
    else:
        cause = d.get("cause")
        if not cause:
            typer.echo(f"PASS: no divergent module: step {d['step']} agrees module by module on both sides "
                       f"({len(d['rows'])} module calls)")
        else:
            typer.echo(f"DIVERGED at {cause['module']} — {cause['kind']}: {cause['summary']}")
            for line in cause.get("details") or ():
                typer.echo(f"  {line}")
        for note in d.get("notes") or ():
            typer.echo(f"note: {note}")
        typer.echo(f"report: {html_path}\njson:   {json_path}\ntime:   {seconds:.1f} s")
    raise typer.Exit(EXIT_PASS if not d.get("cause") else EXIT_DIVERGED)


def _print_recorded(out_dir: Path, as_json: bool, seconds: float) -> None:
    """The diagnosis a `diagnose` step recorded in `out_dir` (`diagnosis.json`, `diagnosis.html`, `dumps/`)."""
    doc = json.loads((out_dir / "diagnosis.json").read_text(encoding="utf-8"))
    _print_doc(doc, out_dir / "diagnosis.json", out_dir / "diagnosis.html",
               {s: out_dir / "dumps" / s for s in ("npu", "gpu")}, as_json, seconds)


def _fail(exc: AlignflowError) -> NoReturn:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)  # 1 means "diverged" here; every error is bad input


def default_step(experiment: Experiment) -> tuple[int, str]:
    """The step `alignflow diagnose RUN` re-runs without --step, and why (`runner.diagnose_step.chosen_step`; issue
    47: the default was step 1)."""
    from alignflow.runner.diagnose_step import chosen_step

    return chosen_step(experiment)


def diagnose_cmd(
    run_id: str = typer.Argument(..., help="Run id (a unique prefix is enough)."),
    step: int | None = typer.Option(None, "--step", min=1, help="Training step to re-run with dumps (its batch "
                                    "and lr); default: the experiment's diagnose.step, else the first step whose "
                                    "learning rate is above 0."),
    budget: str = typer.Option("2GB", "--dump-budget", help="Largest dump per side; larger is refused."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
) -> None:
    """Re-run one step of a run on both sides with dumps; name the first divergent module and the cause.

    A new run, child of RUN, that executes only the `diagnose` step from RUN's converted checkpoints (its
    recorded experiment and inventory); the diagnosis is that run's recorded `diagnosis` artifact.

    Exit 0 when no module diverges, 1 when one does (it is named), 2 on bad input (every other error).
    """
    from alignflow.config.names import training_step_problem
    from alignflow.errors import ConfigError
    from alignflow.runner.run import execute_pipeline, start_run
    from alignflow.runner.session import RunOptions, default_state_dir, open_run
    from alignflow.store import Store
    from alignflow.transport import open_transport

    started = time.perf_counter()
    state = default_state_dir()
    store = Store.open(state_dir=state, upgrade=True)
    try:
        parent = open_run(store, run_id)
        if step is None:
            step, chosen = default_step(parent.experiment)
            typer.echo(f"diagnose: step {step}, {chosen}", err=True)
        # before anything is recorded or looked up (issue 45: a step past the trainings was refused by the step,
        # after preflight and the cache, leaving an `error` run)
        why = training_step_problem(step, parent.experiment)
        if why is not None:
            raise ConfigError(f"--step {step}: run {parent.run_id} of {parent.experiment.name}: {why}")
        options = RunOptions(parent=parent.run_id, reuse_parent=True, only=("diagnose",), force=("diagnose",),
                             trigger="diagnose", recorded_from=parent.run_id)
        child = start_run(parent.params.experiment_path, parent.params.hosts_path, store=store,
                          state_dir=state, options=options,
                          experiment_update={"diagnose": {"step": step, "dump_budget_bytes": _budget(budget)}})
        view = execute_pipeline(child, store=store, state_dir=state, transport_factory=open_transport,
                                events=lambda m: typer.echo(m, err=True))
    except AlignflowError as exc:
        _fail(exc)
    finally:
        store.close()
    done = view.step("diagnose")
    if view.status != "completed" or done is None or not done.artifacts:
        _fail(AlignflowError(f"run {view.run_id}: {view.error or 'the diagnose step did not run'}"))
    out_dir = Path(done.artifacts[0].path)
    _print_recorded(out_dir, as_json, time.perf_counter() - started)

def dumps_cmd(
    npu: Path = typer.Argument(..., help="NPU-side dump: a twin dump directory or an msprobe step/rank directory."),
    gpu: Path = typer.Argument(..., help="GPU-side dump (the reference), same kinds."),
    experiment: Path = typer.Option(..., "--experiment", help="Experiment file (its conversion spec maps names)."),
    npu_after: Path | None = typer.Option(None, "--npu-after", help="msprobe: the NPU dump of the next step."),
    gpu_after: Path | None = typer.Option(None, "--gpu-after", help="msprobe: the GPU dump of the next step."),
    npu_strip: str = typer.Option("", "--npu-strip", help="msprobe: wrapper prefix of NPU module names."),
    gpu_strip: str = typer.Option("module.module.", "--gpu-strip", help="msprobe: wrapper prefix (Megatron)."),
    out: Path = typer.Option(Path("diagnosis"), "--out", help="Output directory (diagnosis.json/.html)."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
) -> None:
    """Diagnose two existing dumps (twin or msprobe) through the experiment's conversion spec.

    Exit 0 when no module diverges, 1 when one does (it is named), 2 on bad input (every other error).
    """
    from alignflow.config.experiment import load_experiment
    from alignflow.diagnose.compare import diagnose_dumps
    from alignflow.diagnose.core import write_outputs
    from alignflow.diagnose.mapping import mapping_for
    from alignflow.diagnose.msprobe import read_msprobe_dump
    from alignflow.frameworks.dumpfile import DUMP_JSON, read_dump

    started = time.perf_counter()
    try:
        exp = load_experiment(experiment)

        def read(path: Path, side: str, after: Path | None, strip: str) -> Any:
            native = (path / DUMP_JSON).is_file() and '"alignflow-twin-dump"' in (path / DUMP_JSON).read_text()
            return read_dump(path) if native else read_msprobe_dump(path, side=side, after=after, strip=strip)

        d = diagnose_dumps(read(npu, "npu", npu_after, npu_strip), read(gpu, "gpu", gpu_after, gpu_strip),
                           mapping_for(exp))
        out.mkdir(parents=True, exist_ok=True)
        result = write_outputs(d, out, {"npu": npu, "gpu": gpu})
    except AlignflowError as exc:
        _fail(exc)
    _print(result, as_json, time.perf_counter() - started)

def setup_cmd(
    experiment: Path = typer.Argument(..., help="Experiment file."),
    dump_path: str = typer.Option(..., "--dump-path", help="Where msprobe writes, on the training host."),
    step: int = typer.Option(1, "--step", min=1, help="Training step to dump (and the next one, for updates)."),
    task: str = typer.Option("tensor", "--task", help="tensor (real data) or statistics (small)."),
    out: Path = typer.Option(Path("msprobe-setup"), "--out", help="Directory for config.json and the mappings."),
) -> None:
    """Write msprobe's config.json, layer_mapping.yaml and the lines that switch msprobe on in each framework.

    Exit 0 written, 2 on a usage or configuration error.
    """
    from alignflow.config.experiment import load_experiment
    from alignflow.config.names import training_step_problem
    from alignflow.diagnose.mapping import mapping_for
    from alignflow.diagnose.msprobe import msprobe_config, setup_text, write_mapping_files
    from alignflow.errors import ConfigError

    try:
        exp = load_experiment(experiment)
        why = training_step_problem(step, exp)
        if why is not None:
            raise ConfigError(f"--step {step}: {exp.name}: {why}")
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(msprobe_config(dump_path, step=step, task=task), indent=2))
        files = write_mapping_files(out, mapping_for(exp))
        for name, text in setup_text(str(out / "config.json")).items():
            (out / f"{name}.txt").write_text(text)
    except AlignflowError as exc:
        _fail(exc)
    typer.echo(f"wrote {out / 'config.json'}, {files['layer_mapping']}, {out / 'gpu_megatron.txt'}, "
               f"{out / 'npu_mindformers.txt'}")

def noise_cmd(
    experiment: Path = typer.Argument(..., help="Experiment file."),
    run_id: str = typer.Option(..., "--run", help="A run whose megatron_ckpt the reference side trains from."),
    runs: int | None = typer.Option(None, "--runs", min=2, help="Trainings (default: criteria.noise_runs or 3)."),
    as_json: bool = typer.Option(False, "--json", help="Print the noise floor as JSON."),
) -> None:
    """Train the reference (GPU) side N times with determinism off; record each statistic's self-noise.

    Exit 0 recorded, 1 when a training fails, 2 on a usage or configuration error.
    """
    from alignflow.config.experiment import load_experiment
    from alignflow.diagnose.noise import noise_for_run
    from alignflow.runner.session import default_state_dir
    from alignflow.store import Store

    started = time.perf_counter()
    store = Store.open(state_dir=default_state_dir(), upgrade=True)
    try:
        exp = load_experiment(experiment)
        floor = noise_for_run(store, exp, run_id, runs=runs or exp.noise_runs or 3,
                              work_dir=default_state_dir() / "noise")
    except AlignflowError as exc:
        _fail(exc)
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps(floor.to_json(), indent=1))
    else:
        typer.echo(f"noise floor of {exp.name}: {floor.runs} runs (store run {floor.run_id})")
        for metric, stats in floor.statistics.items():
            typer.echo(f"  {metric}: " + ", ".join(f"{k} {v:.3g}" for k, v in stats.items()))
        typer.echo(f"time: {time.perf_counter() - started:.1f} s")


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose_cmd)
    app.command("diagnose-dumps")(dumps_cmd)
    app.command("diagnose-setup")(setup_cmd)
    app.command("noise")(noise_cmd)
