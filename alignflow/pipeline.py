"""The alignment pipeline as data: every step declared once, in `STEPS`, with everything the rest of alignflow
needs to know about it — where it runs, what it reads and writes (with each output's path in the step's output
directory), its time limit, which executor runs it and which training log it produces.

```
 npu_base_train -base_ckpt-> convert_bf16 -bf16_ckpt-> convert_megatron -megatron_ckpt-> gpu_train --gpu_log--+
                                  |                          |                                              |
                                  |                          +--> early_gate (optional)                     +-> compare
                                  +--bf16_ckpt--> npu_reload_train ---------------------------npu_log-------+
```

The planner (`plan`), the DAG walker (`ready`: which steps may start now), the runner, preflight, the flow and
the CLI all read these declarations, so what runs concurrently follows from the inputs each step declares:
`npu_reload_train` needs only `bf16_ckpt`, so it starts beside `convert_megatron` and the gate; `gpu_train`
starts once the gate (when the run has one) has passed. How a step's
command is built is bound to the step by name in `alignflow.runner.steps` (the builders need the backends, which
sit above this module).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

from alignflow.errors import PipelineError

Role = Literal["ascend", "cpu", "cuda", "controller"]
ArtifactKind = Literal["data", "checkpoint", "log", "report", "config"]
ExecutorKind = Literal["job", "gate", "compare", "diagnose"]
"""`job`: one command as a detached job on the step's host; `gate`: both sides' short trainings at once;
`compare`: in-process on the controller; `diagnose`: both sides re-run one step with tensor dumps."""

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class ArtifactDef:
    """A named artifact that one step produces and others consume."""

    name: str
    kind: ArtifactKind
    description: str


@dataclass(frozen=True, slots=True)
class Output:
    """One output of a step: the artifact and its path relative to the step's output directory (`{out}`)."""

    artifact: str
    path: str


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One pipeline step.

    `after`: steps that must end before this one starts when they are in the plan, without it reading their
    outputs (the GPU training waits for the early gate, which exists to stop it from starting in vain).
    `log_source` names the training log's metrics in the store (`None`: not a training).
    """

    name: str
    role: Role
    inputs: tuple[str, ...]
    outputs: tuple[Output, ...]
    description: str
    executor: ExecutorKind
    timeout_s: float = HOUR_S
    optional: bool = False
    after: tuple[str, ...] = ()
    log_source: str | None = None

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.artifact for o in self.outputs)


ARTIFACTS: dict[str, ArtifactDef] = {
    a.name: a
    for a in (
        ArtifactDef("data", "data", "the token data file both sides read (same sha256)"),
        ArtifactDef("base_ckpt", "checkpoint", "MindFormers checkpoint of the NPU base training"),
        ArtifactDef("npu_base_log", "log", "log of the NPU base training"),
        ArtifactDef("bf16_ckpt", "checkpoint", "bf16 MindFormers checkpoint (optimizer state dropped)"),
        ArtifactDef("megatron_ckpt", "checkpoint", "Megatron legacy checkpoint converted from the bf16 one"),
        ArtifactDef("gate_report", "report", "early gate: step-1 losses of both sides after conversion"),
        ArtifactDef("gpu_log", "log", "log of the GPU training from the Megatron checkpoint"),
        ArtifactDef("npu_log", "log", "log of the NPU training from the bf16 checkpoint"),
        ArtifactDef("report", "report", "comparison report (HTML, PNG, CSV, markdown) and verdict"),
        ArtifactDef("diagnosis", "report", "both sides' tensor dumps of one step, the module table, the cause"),
    )
}

STEPS: tuple[StepSpec, ...] = (
    StepSpec("npu_base_train", "ascend", ("data",),
             (Output("base_ckpt", "checkpoint"), Output("npu_base_log", "train.log")),
             "train the base model on the NPU side and save its checkpoint",
             executor="job", timeout_s=24 * HOUR_S, log_source="npu_base"),
    StepSpec("convert_bf16", "cpu", ("base_ckpt",), (Output("bf16_ckpt", "bf16"),),
             "cast every parameter to bf16, drop optimizer state, keep a loadable MindFormers layout",
             executor="job", timeout_s=4 * HOUR_S),
    StepSpec("convert_megatron", "cpu", ("bf16_ckpt",), (Output("megatron_ckpt", "megatron"),),
             "convert the bf16 checkpoint to Megatron's legacy format with a fail-closed spec",
             executor="job", timeout_s=4 * HOUR_S),
    StepSpec("early_gate", "controller", ("data", "bf16_ckpt", "megatron_ckpt"), (Output("gate_report", "."),),
             "train both sides 2 steps from the converted weights; step-1 losses must agree",
             executor="gate", timeout_s=2 * HOUR_S, optional=True),
    StepSpec("gpu_train", "cuda", ("data", "megatron_ckpt"), (Output("gpu_log", "train.log"),),
             "train on the GPU side from the Megatron checkpoint",
             executor="job", timeout_s=24 * HOUR_S, after=("early_gate",), log_source="gpu"),
    StepSpec("npu_reload_train", "ascend", ("data", "bf16_ckpt"), (Output("npu_log", "train.log"),),
             "train on the NPU side from the bf16 checkpoint",
             executor="job", timeout_s=24 * HOUR_S, log_source="npu"),
    StepSpec("compare", "controller", ("gpu_log", "npu_log"), (Output("report", "."),),
             "compare both logs against the acceptance criteria; write the report",
             executor="compare"),
    StepSpec("diagnose", "controller", ("data", "bf16_ckpt", "megatron_ckpt"), (Output("diagnosis", "."),),
             "re-run one training step on both sides with tensor dumps; name the first divergent module and why",
             executor="diagnose", timeout_s=2 * HOUR_S, optional=True),
)

STEP_NAMES: tuple[str, ...] = tuple(s.name for s in STEPS)
_BY_NAME = {s.name: s for s in STEPS}


def step(name: str) -> StepSpec:
    """The step called `name`; the error lists the steps that exist (and the closest one)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, STEP_NAMES, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise PipelineError(f"unknown step '{name}'; {hint}steps are: {', '.join(STEP_NAMES)}") from None


def producer(artifact: str) -> StepSpec | None:
    """The step that produces `artifact` (None for `data`, which comes from the experiment)."""
    for s in STEPS:
        if artifact in s.output_names:
            return s
    return None


def upstream(name: str) -> list[str]:
    """Steps whose outputs `name` reads directly."""
    found = []
    for artifact in step(name).inputs:
        p = producer(artifact)
        if p is not None and p.name not in found:
            found.append(p.name)
    return found


def downstream(names: Iterable[str]) -> list[str]:
    """`names` and every step that depends on them, transitively, in pipeline order."""
    selected = {step(n).name for n in names}
    changed = True
    while changed:
        changed = False
        for s in STEPS:
            if s.name not in selected and any(u in selected for u in upstream(s.name)):
                selected.add(s.name)
                changed = True
    return [s for s in STEP_NAMES if s in selected]


def upstream_closure(names: Iterable[str]) -> list[str]:
    """Every step whose outputs `names` need, transitively (not `names` themselves), in pipeline order."""
    wanted = {step(n).name for n in names}
    needed: set[str] = set()
    todo = list(wanted)
    while todo:
        for u in upstream(todo.pop()):
            if u not in needed and u not in wanted:
                needed.add(u)
                todo.append(u)
    return [s for s in STEP_NAMES if s in needed]


@dataclass(frozen=True, slots=True)
class Plan:
    """Which steps a run walks, which of them must run even when a cached result exists, and which may only be
    reused (the upstream steps of an `--only` selection: they supply their recorded outputs, never execute)."""

    steps: tuple[str, ...]
    forced: frozenset[str]
    reuse_only: frozenset[str] = frozenset()

    def ready(self, done: Collection[str], started: Collection[str]) -> list[str]:
        """Steps of the plan that may start now: not started, and every step of the plan they read from done.

        A step whose producer is not in the plan (`--only`) takes that input from a cached or parent run, so it
        does not wait for it. This one rule is the pipeline's concurrency: there is no list of steps that run
        side by side.
        """
        planned = set(self.steps)
        return [n for n in self.steps
                if n not in done and n not in started
                and all(u in done for u in (*upstream(n), *step(n).after) if u in planned)]


def plan(
    *,
    enabled_optional: Iterable[str] = (),
    from_step: str | None = None,
    only: Iterable[str] = (),
    force: Iterable[str] = (),
) -> Plan:
    """Select the steps of a run.

    - default: every non-optional step (plus the optional ones enabled), cache decides what actually re-executes;
    - `from_step`: that step and everything after it in pipeline order are forced; earlier steps are reused;
    - `only`: exactly these steps execute; the steps they read from are walked too, as reuse-only steps that
      take their outputs from the parent run or the cache (and fail the run when there are none);
    - `force`: these steps and everything that depends on them re-execute even if cached.

    An optional step named in `only`, `force` or `from_step` is enabled for this run: asking for it by name is
    what turns it on (`alignflow diagnose RUN` is `only=("diagnose",)`; the launch form offers every step).
    """
    only = list(only)
    named = [*only, *force, *([from_step] if from_step else [])]
    enabled = {step(n).name for n in enabled_optional} | {step(n).name for n in named if step(n).optional}
    active = [s.name for s in STEPS if not s.optional or s.name in enabled]
    forced: set[str] = set()
    if force:
        forced |= set(downstream(force))
    if from_step is not None:
        start = STEP_NAMES.index(step(from_step).name)
        forced |= {n for n in STEP_NAMES[start:] if n in active}
    reuse_only = set(upstream_closure(only)) if only else set()
    selected = [n for n in active if n in set(only) | reuse_only] if only else active
    return Plan(steps=tuple(selected), forced=frozenset(n for n in forced if n in selected and n not in reuse_only),
                reuse_only=frozenset(reuse_only))
