"""`run_diagnosis`: re-run one training step on both sides with dumping on, then locate the first divergence.

The pipeline-step core of `alignflow diagnose` (issue 21). Both sides train the requested step from the weights
their long trainings load (the bf16 MindFormers checkpoint on the NPU side and the Megatron checkpoint converted
from it on the GPU side in the classic pipeline; one base for two Megatron sides) and the same batch, through the
same backends as every training (`render_training` -> `CommandTemplate`), launched as detached jobs through each
side's `Transport` and fetched back verified. The twin dumps natively (`ALIGNFLOW_TWIN_DUMP`); the real frameworks
dump through msprobe, whose setup `alignflow.diagnose.msprobe` renders (`alignflow diagnose-setup`) and whose dumps
`diagnose_dumps` reads too.

Outputs, recorded like any step's: `out_dir/dumps/{npu,gpu}/` (the two dumps), `diagnosis.json`, `diagnosis.html`.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from alignflow.backends import CommandTemplate, Side, TrainSpec, render_training, side_backend
from alignflow.backends.registry import megatron_version_of
from alignflow.config.experiment import Experiment
from alignflow.diagnose.compare import Diagnosis, diagnose_dumps
from alignflow.diagnose.mapping import DumpMapping, mapping_for
from alignflow.diagnose.metrics import Tolerance
from alignflow.errors import AlignflowError, ConfigError, RemoteJobError
from alignflow.frameworks.dumpfile import (
    DEFAULT_BUDGET_BYTES,
    DUMP_ENV,
    DumpBudgetExceeded,
    DumpRequest,
    budget_text,
    read_dump,
)
from alignflow.pipeline import SIDE_NAMES
from alignflow.transport import JobHandle, JobSpec, Transport

log = logging.getLogger(__name__)
STEP = "diagnose"
SIDES: tuple[Side, ...] = SIDE_NAMES
_PLACEHOLDER = re.compile(r"\{(python|out|in:[A-Za-z0-9_]+)\}")


@dataclass(frozen=True, slots=True)
class Checkpoints:
    """The converted checkpoints, as paths on each side's host."""

    npu: str  # what npu_reload_train loads (the bf16 MindFormers checkpoint in the classic pipeline)
    gpu: str  # what gpu_train loads (the Megatron checkpoint converted from it)


@dataclass(frozen=True, slots=True)
class DataRef:
    """The one data file (or indexed-data directory) both sides read, as a path on each side's host."""

    npu: str
    gpu: str
    sha256: str


@dataclass(frozen=True, slots=True)
class DiagnoseResult:
    """What the step produced: the diagnosis and its files under `out_dir`."""

    diagnosis: Diagnosis
    out_dir: Path
    dumps: dict[Side, Path]
    json_path: Path
    html_path: Path


def estimate_dump_bytes(mapping: DumpMapping, experiment: Experiment) -> int:
    """A lower bound of one side's dump: every parameter three times (loaded, gradient, updated) in fp32."""
    from alignflow.convert.plan import build_plan
    from alignflow.convert.registry import load_spec

    plan = build_plan(load_spec(experiment.spec_ref), experiment.model, flavor="local",
                      megatron_version=megatron_version_of(experiment))
    elements = 0
    for shape in plan.target_shapes().values():
        n = 1
        for d in shape:
            n *= d
        elements += n
    return 3 * 4 * elements


def run_diagnosis(
    experiment: Experiment,
    *,
    checkpoints: Checkpoints,
    data: DataRef,
    transport: Transport | Mapping[str, Transport],
    out_dir: Path,
    step: int = 1,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    tolerance: Tolerance | None = None,
    poll_s: float = 0.5,
    timeout_s: float | None = 3600.0,
    on_launch: Callable[[list[JobHandle]], None] | None = None,
) -> DiagnoseResult:
    """Dump step `step` on both sides and diagnose it; raises for a failed job or a refused budget, never for a
    divergence (that is the diagnosis' verdict). `on_launch` receives both sides' job handles once they are
    launched (the pipeline step records them, so that cancelling the run kills them)."""
    if any(side_backend(experiment, s).dumps != "native" for s in SIDES):
        raise ConfigError(f"{STEP}: the {experiment.npu.kind}/{experiment.gpu.kind} backends dump through msprobe: "
                          "render their setup with `alignflow diagnose-setup EXPERIMENT`, run the step, then compare "
                          "the dumps with `alignflow diagnose-dumps`")
    if not 1 <= step <= experiment.training.steps:
        raise ConfigError(f"{STEP}: --step {step} is outside the experiment's 1..{experiment.training.steps}")
    if budget_bytes < 1:
        raise ConfigError(f"{STEP}: the dump budget must be positive")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"{out_dir}: not empty; a diagnosis never overwrites another")
    mapping = mapping_for(experiment)
    estimate = estimate_dump_bytes(mapping, experiment)
    if estimate > budget_bytes:
        raise DumpBudgetExceeded(f"{STEP}: a dump of this model needs at least {budget_text(estimate)} per side, "
                                 f"more than the dump budget of {budget_text(budget_bytes)}; nothing was launched")
    transports = {s: transport for s in SIDES} if not isinstance(transport, Mapping) else dict(transport)
    missing = [s for s in SIDES if s not in transports]
    if missing:
        raise ConfigError(f"{STEP}: no transport for the {', '.join(missing)} side")
    runs = {side: SideRun(transports[side], getattr(checkpoints, side), getattr(data, side)) for side in SIDES}
    dumps = dump_step(experiment, runs, data_sha256=data.sha256, out_dir=out_dir, step=step,
                      budget_bytes=budget_bytes, poll_s=poll_s, timeout_s=timeout_s, on_launch=on_launch)
    diagnosis = diagnose_dumps(read_dump(dumps["npu"]), read_dump(dumps["gpu"]), mapping, tolerance)
    return write_outputs(diagnosis, out_dir, dumps)


@dataclass(frozen=True, slots=True)
class SideRun:
    """One side's training of a dumped step: where it runs, and its checkpoint and data as paths on that host."""

    transport: Transport
    checkpoint: str
    data: str


def dump_step(
    experiment: Experiment,
    runs: Mapping[Side, SideRun],
    *,
    data_sha256: str,
    out_dir: Path,
    step: int,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    poll_s: float = 0.5,
    timeout_s: float | None = 3600.0,
    on_launch: Callable[[list[JobHandle]], None] | None = None,
) -> dict[Side, Path]:
    """Train step `step` of the experiment with dumping on, on the sides in `runs` (all launched before any is
    waited for), and fetch each side's dump to `out_dir/dumps/<side>`; raises for a failed job (cancelling the
    others). `run_diagnosis` dumps both sides with it."""
    jobs: list[tuple[Side, Transport, JobHandle, str]] = []
    try:
        for side, run in runs.items():
            jobs.append((side, run.transport, *_launch(experiment, side, run.transport, run.checkpoint, run.data,
                                                       data_sha256, step, budget_bytes)))
        if on_launch is not None:
            on_launch([handle for _, _, handle, _ in jobs])
        for side, t, handle, _ in jobs:
            state = t.wait(handle, poll_s=poll_s, timeout_s=timeout_s)
            if not state.ok:
                tail = t.tail(handle, 4096, stream="stderr").rstrip().splitlines()[-15:]
                out_tail = t.tail(handle, 4096).rstrip().splitlines()[-5:]
                raise RemoteJobError(f"{t.host.name}: {STEP} ({side} side) {state}; job dir {handle.job_dir}\n"
                                     + "\n".join("    " + line for line in [*out_tail, *tail]),
                                     handle=handle, state=state)
    except BaseException:
        for _, t, handle, _ in jobs:
            try:
                if not t.status(handle).finished:
                    t.cancel(handle)
            except AlignflowError:
                continue
        raise
    dumps: dict[Side, Path] = {}
    for side, t, _, remote in jobs:
        local = out_dir / "dumps" / side
        local.parent.mkdir(parents=True, exist_ok=True)
        t.get(remote, str(local))
        dumps[side] = local
    return dumps


def write_outputs(diagnosis: Diagnosis, out_dir: Path, dumps: Mapping[Side, Path]) -> DiagnoseResult:
    """`diagnosis.json` and `diagnosis.html` next to the dumps."""
    from alignflow.diagnose.report import html_page

    json_path, html_path = out_dir / "diagnosis.json", out_dir / "diagnosis.html"
    json_path.write_text(json.dumps(diagnosis.to_json(), indent=1), encoding="utf-8")
    html_path.write_text(html_page(diagnosis), encoding="utf-8")
    return DiagnoseResult(diagnosis, out_dir, dict(dumps), json_path, html_path)


def fill_placeholders(text: str, values: Mapping[str, str]) -> str:
    """`{python}`, `{out}`, `{in:<name>}` of a command template filled in (an unknown one is an error)."""

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise ConfigError(f"{STEP}: placeholder {{{key}}} has no value (known: {', '.join(sorted(values))})")
        return values[key]

    return _PLACEHOLDER.sub(sub, text)


def side_training(experiment: Experiment, side: Side, data_sha256: str) -> CommandTemplate:
    """The side's training of the experiment that a diagnosis dumps (all its steps: the schedule is the
    experiment's), before host paths are filled in: two dumps of a side with the same template, checkpoint and
    data are the same training."""
    data_arg = "{in:data}" + (f"/{experiment.data.prefix}" if experiment.data.prefix else "")
    spec = TrainSpec(STEP, side, experiment.training.steps, data_arg, data_sha256, "{in:checkpoint}", None)
    return render_training(experiment, spec)


def _launch(experiment: Experiment, side: Side, t: Transport, load: str, data: str, sha256: str, step: int,
            budget_bytes: int) -> tuple[JobHandle, str]:
    """Launch the side's training (`side_training`) detached, asking it to dump `step` only; (handle, remote dump
    path)."""
    template = side_training(experiment, side, sha256)
    out = str(t.path(f"artifacts/{STEP}/{side}-{uuid.uuid4().hex[:12]}"))
    values = {"python": t.python(), "out": out, "in:data": data, "in:checkpoint": load}
    t.mkdir(out)
    for rel, text in template.files.items():
        t.write_text(f"{out}/{rel}", fill_placeholders(text, values))
    dump_path = f"{out}/dump"
    request = DumpRequest(dump_path=dump_path, step=step, budget_bytes=budget_bytes, side=side)
    t.write_text(f"{out}/dump-request.json", json.dumps(request.to_json()))
    env = {k: fill_placeholders(v, values) for k, v in template.env.items()} | {DUMP_ENV: f"{out}/dump-request.json"}
    argv = [fill_placeholders(a, values) for a in template.argv]
    handle = t.launch(JobSpec(argv=argv, name=f"{STEP}-{side}", env=env, cwd=out, take_slot=True))
    log.info("%s: %s side launched on %s (job %s)", STEP, side, t.host.name, handle.job_dir)
    return handle, dump_path
