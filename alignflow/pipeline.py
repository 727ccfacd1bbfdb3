"""The alignment pipeline as data: six steps, what each reads and writes, and where it runs by default.

```
 npu_base_train -base_ckpt-> convert_bf16 -bf16_ckpt-> convert_megatron -megatron_ckpt-> gpu_train -gpu_log--+
 npu_reload_train <-bf16_ckpt--'                                                                          +-> compare
                 '-------------------------------------------------------------------------npu_log--------+
```

Everything that decides *which* steps run (from-step, only, force, a re-run of one step and what depends on
it) is computed here from these declarations, so the Prefect flow and the CLI share one answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from alignflow.errors import PipelineError

Role = Literal["ascend", "cpu", "cuda", "controller"]
ArtifactKind = Literal["data", "checkpoint", "log", "report", "config"]


@dataclass(frozen=True, slots=True)
class ArtifactDef:
    """A named artifact that one step produces and others consume."""

    name: str
    kind: ArtifactKind
    description: str


@dataclass(frozen=True, slots=True)
class StepDef:
    """One pipeline step: its default host role, the artifacts it reads and writes."""

    name: str
    role: Role
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    description: str
    optional: bool = False


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
    )
}

STEPS: tuple[StepDef, ...] = (
    StepDef("npu_base_train", "ascend", ("data",), ("base_ckpt", "npu_base_log"),
            "train the base model on the NPU side and save its checkpoint"),
    StepDef("convert_bf16", "cpu", ("base_ckpt",), ("bf16_ckpt",),
            "cast every parameter to bf16, drop optimizer state, keep a loadable MindFormers layout"),
    StepDef("convert_megatron", "cpu", ("bf16_ckpt",), ("megatron_ckpt",),
            "convert the bf16 checkpoint to Megatron's legacy format with a fail-closed spec"),
    StepDef("early_gate", "controller", ("data", "bf16_ckpt", "megatron_ckpt"), ("gate_report",),
            "train both sides 2 steps from the converted weights; step-1 losses must agree", optional=True),
    StepDef("gpu_train", "cuda", ("data", "megatron_ckpt"), ("gpu_log",),
            "train on the GPU side from the Megatron checkpoint"),
    StepDef("npu_reload_train", "ascend", ("data", "bf16_ckpt"), ("npu_log",),
            "train on the NPU side from the bf16 checkpoint"),
    StepDef("compare", "controller", ("gpu_log", "npu_log"), ("report",),
            "compare both logs against the acceptance criteria; write the report"),
)

STEP_NAMES: tuple[str, ...] = tuple(s.name for s in STEPS)
_BY_NAME = {s.name: s for s in STEPS}


def step(name: str) -> StepDef:
    """The step called `name`; the error lists the steps that exist."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise PipelineError(f"unknown step '{name}'; steps are: {', '.join(STEP_NAMES)}") from None


def producer(artifact: str) -> StepDef | None:
    """The step that produces `artifact` (None for `data`, which comes from the experiment)."""
    for s in STEPS:
        if artifact in s.outputs:
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


@dataclass(frozen=True, slots=True)
class Plan:
    """Which steps a run executes, and which of them must run even when a cached result exists."""

    steps: tuple[str, ...]
    forced: frozenset[str]


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
    - `only`: exactly these steps (their inputs must be available from a cached or parent run);
    - `force`: these steps and everything that depends on them re-execute even if cached.
    """
    only = list(only)
    enabled = {step(n).name for n in enabled_optional}
    active = [s.name for s in STEPS if not s.optional or s.name in enabled]
    for n in [*only, *force, *([from_step] if from_step else [])]:
        if step(n).optional and n not in enabled:
            raise PipelineError(f"step '{n}' is optional and not enabled for this experiment")
    forced: set[str] = set()
    if force:
        forced |= set(downstream(force))
    if from_step is not None:
        start = STEP_NAMES.index(step(from_step).name)
        forced |= {n for n in STEP_NAMES[start:] if n in active}
    selected = [n for n in active if n in set(only)] if only else active
    return Plan(steps=tuple(selected), forced=frozenset(n for n in forced if n in selected))
