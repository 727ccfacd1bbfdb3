"""The alignment pipeline as data: the two sides, the checkpoint formats, and the steps of a run derived from them.

A run trains two **sides** (`SIDES`: the NPU side, tested, and the GPU side, the reference) from one **base
checkpoint** on the same data, then compares their logs. Which steps sit between the base and each side's training
follows from the checkpoint formats (`derive`): none where a side loads the base's format, one conversion step per
format a side needs otherwise (shared by both sides when they need the same one). The classic pipeline — a
MindFormers side against a Megatron side, the base trained on the NPU side — derives to

```
 npu_base_train -base_ckpt-> convert_bf16 -bf16_ckpt-> convert_megatron -megatron_ckpt-> gpu_train --gpu_log--+
                                  |                          |                                              |
                                  |                          +--> early_gate (optional)                     +-> compare
                                  +--bf16_ckpt--> npu_reload_train ---------------------------npu_log-------+
```

and a Megatron-against-Megatron one to `npu_base_train -base_ckpt-> {gpu_train, npu_reload_train} -> compare`, with
no conversion at all. A base given as a file (`base: {path, format}` in the experiment) replaces `npu_base_train`:
`base_ckpt` is then a run input, like the data.

This module knows formats by name only; what a side loads and saves is its backend's (`alignflow.backends`), which
calls `derive` with those names. The planner (`Pipeline.plan`), the DAG walker (`Plan.ready`: which steps may start
now), the runner, preflight, the flow and the CLI all read the derived `Pipeline`, so what runs concurrently follows
from the inputs each step declares: `npu_reload_train` needs only its own checkpoint, so it starts beside
`convert_megatron` and the gate; `gpu_train` starts once the gate (when the run has one) has passed.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from alignflow.errors import PipelineError

Role = Literal["ascend", "cpu", "cuda", "controller"]
ArtifactKind = Literal["data", "checkpoint", "log", "report", "config"]
ExecutorKind = Literal["job", "gate", "compare", "diagnose"]
"""`job`: one command as a detached job on the step's host; `gate`: both sides' short trainings at once;
`compare`: in-process on the controller; `diagnose`: both sides re-run one step with tensor dumps."""
Side = Literal["npu", "gpu"]
Training = Literal["base", "aligned"]
"""`base`: trains the base checkpoint from scratch and saves it; `aligned`: one side's training that is compared."""
CheckpointFormat = Literal["mindformers", "megatron", "torch_dist", "hf", "dcp"]
"""Checkpoint formats, each read and written by its own library (`alignflow.convert.formats`): MindFormers
safetensors + `common.json` + tracker; Megatron legacy (`--ckpt-format torch`, per-rank `model_optim_rng.pt`);
Megatron `torch_dist` (megatron-core `dist_checkpointing`); Hugging Face safetensors (a `save_pretrained`
directory); PyTorch DCP (`torch.distributed.checkpoint`, a model state dict under Hugging Face names)."""
CHECKPOINT_FORMATS: tuple[CheckpointFormat, ...] = get_args(CheckpointFormat)
BF16_EXPORT: frozenset[CheckpointFormat] = frozenset({"mindformers"})
"""Formats whose *trained* base is first exported to bf16 without optimizer state (`convert_bf16`), as the seeds'
protocol does for a MindFormers base training; a Megatron base is loaded as saved (`--finetune --no-load-optim`
skips its optimizer state), a base given as a file is loaded as given."""

CONVERTED_ONLY_WITH: dict[CheckpointFormat, frozenset[CheckpointFormat]] = {
    "torch_dist": frozenset({"mindformers"}),
}
"""Formats a side may load but that are converted only from and to the formats listed: torch_dist is written and read
through megatron-core's dist_checkpointing with the MindFormers spec (`alignflow.convert.engine`), not through the
Megatron-name pivot of the other formats. A pipeline that would convert one to or from another format is refused where
the experiment is read (`alignflow.backends.registry.pipeline_problems`), and `alignflow convert` refuses it too."""


def not_converted(source: CheckpointFormat, target: CheckpointFormat) -> str | None:
    """Why alignflow cannot convert `source` to `target` (None: it can)."""
    for fmt, other in ((source, target), (target, source)):
        partners = CONVERTED_ONLY_WITH.get(fmt)
        if partners is not None and other != fmt and other not in partners:
            return (f"alignflow converts {fmt} only from and to {', '.join(sorted(partners))} (megatron-core's "
                    "dist_checkpointing with the MindFormers spec); convert through mindformers, or have the side "
                    f"load {fmt} as given")
    return None


Naming = Literal["mindformers", "megatron", "hf"]
NAMING: dict[CheckpointFormat, Naming] = {"mindformers": "mindformers", "megatron": "megatron",
                                          "torch_dist": "megatron", "hf": "hf", "dcp": "hf"}
"""The parameter names (and layouts) each format holds: MindFormers PyNative's, megatron-core GPTModel's, Hugging
Face's (a DCP checkpoint holds a model state dict under Hugging Face names)."""

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class SideDef:
    """One side of every alignment: its name, label, host role, default backend and the steps that train it."""

    name: Side
    label: str
    role: Role
    default_kind: str  # the backend a side section without `kind` gets (alignflow.backends)
    training: str  # the step whose log is compared
    log: str  # that step's log artifact (and its metrics' source in the store: the side's name)
    compared_as: Literal["test", "reference"]  # per-step error = test - reference


SIDES: tuple[SideDef, ...] = (
    SideDef("npu", "NPU", "ascend", "twin-mindspore", "npu_reload_train", "npu_log", "test"),
    SideDef("gpu", "GPU", "cuda", "twin-torch", "gpu_train", "gpu_log", "reference"),
)
SIDE_NAMES: tuple[Side, ...] = tuple(s.name for s in SIDES)
TEST = next(s for s in SIDES if s.compared_as == "test")
REFERENCE = next(s for s in SIDES if s.compared_as == "reference")
BASE_SIDE: Side = "npu"  # the side whose backend trains the base checkpoint when the experiment gives none


def side(name: str) -> SideDef:
    """The side called `name`."""
    for s in SIDES:
        if s.name == name:
            return s
    raise PipelineError(f"unknown side {name!r}; the sides are {', '.join(SIDE_NAMES)}")


@dataclass(frozen=True, slots=True)
class ArtifactDef:
    """A named artifact that one step produces and others consume."""

    name: str
    kind: ArtifactKind
    description: str
    label: str = ""  # a short name for tables ("bf16 checkpoint")


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
    `log_source` names the training log's metrics in the store (`None`: not a training). A training names its
    `side`, whether it trains the base or the compared run (`training`) and the checkpoint artifact it `load`s
    (None: from scratch); a conversion names its formats (`converts`: source, target).
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
    side: Side | None = None
    training: Training | None = None
    load: str | None = None
    converts: tuple[CheckpointFormat, CheckpointFormat] | None = None

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.artifact for o in self.outputs)


def checkpoint_artifact(fmt: CheckpointFormat) -> str:
    """The artifact a conversion into `fmt` produces (`megatron_ckpt`)."""
    return f"{fmt}_ckpt"


def conversion_step(fmt: CheckpointFormat) -> str:
    """The step that converts the base into `fmt` (`convert_megatron`)."""
    return f"convert_{fmt}"


_FORMAT_TITLES: dict[CheckpointFormat, str] = {
    "mindformers": "MindFormers checkpoint", "megatron": "Megatron legacy checkpoint",
    "torch_dist": "Megatron torch_dist checkpoint", "hf": "Hugging Face safetensors checkpoint",
    "dcp": "PyTorch DCP checkpoint",
}

ARTIFACTS: dict[str, ArtifactDef] = {
    a.name: a
    for a in (
        ArtifactDef("data", "data", "the token data file both sides read (same sha256)"),
        ArtifactDef("base_ckpt", "checkpoint", "the base checkpoint both sides start from (trained on the NPU side, "
                    "or the experiment's `base`)", "base checkpoint"),
        ArtifactDef("npu_base_log", "log", "log of the NPU base training"),
        ArtifactDef("bf16_ckpt", "checkpoint", "bf16 MindFormers checkpoint (optimizer state dropped)",
                    "bf16 checkpoint"),
        *(ArtifactDef(checkpoint_artifact(f), "checkpoint", f"{_FORMAT_TITLES[f]} converted from the base",
                      _FORMAT_TITLES[f].replace(" legacy", "")) for f in CHECKPOINT_FORMATS),
        ArtifactDef("gate_report", "report", "early gate: step-1 losses of both sides after conversion"),
        ArtifactDef("gpu_log", "log", "log of the GPU side's training"),
        ArtifactDef("npu_log", "log", "log of the NPU side's training"),
        ArtifactDef("report", "report", "comparison report (HTML, PNG, CSV, markdown) and verdict"),
        ArtifactDef("diagnosis", "report", "both sides' tensor dumps of one step, the module table, the cause"),
    )
}
RUN_INPUTS = frozenset({"data", "base_ckpt"})  # what a run may take from outside (base_ckpt: `base.path`)


@dataclass(frozen=True, slots=True)
class Formats:
    """What the shape of a pipeline follows: the base checkpoint's format and whether a training makes it, and the
    formats each side loads (preferred first: a conversion produces the first)."""

    base: CheckpointFormat
    base_trained: bool
    loads: Mapping[Side, tuple[CheckpointFormat, ...]]


def _base_train() -> StepSpec:
    return StepSpec("npu_base_train", "ascend", ("data",),
                    (Output("base_ckpt", "checkpoint"), Output("npu_base_log", "train.log")),
                    "train the base model on the NPU side and save its checkpoint",
                    executor="job", timeout_s=24 * HOUR_S, log_source="npu_base", side=BASE_SIDE, training="base")


def _convert_bf16() -> StepSpec:
    return StepSpec("convert_bf16", "cpu", ("base_ckpt",), (Output("bf16_ckpt", "bf16"),),
                    "cast every parameter to bf16, drop optimizer state, keep a loadable MindFormers layout",
                    executor="job", timeout_s=4 * HOUR_S, converts=("mindformers", "mindformers"))


def _convert(source: str, src: CheckpointFormat, dst: CheckpointFormat) -> StepSpec:
    return StepSpec(conversion_step(dst), "cpu", (source,), (Output(checkpoint_artifact(dst), dst),),
                    f"convert the {'bf16' if source == 'bf16_ckpt' else 'base'} checkpoint ({src}) to "
                    f"{_FORMAT_TITLES[dst]} with a fail-closed spec",
                    executor="job", timeout_s=4 * HOUR_S, converts=(src, dst))


def _aligned(s: SideDef, load: str, after: tuple[str, ...]) -> StepSpec:
    return StepSpec(s.training, s.role, ("data", load), (Output(s.log, "train.log"),),
                    f"train on the {s.label} side from {load}", executor="job", timeout_s=24 * HOUR_S, after=after,
                    log_source=s.name, side=s.name, training="aligned", load=load)


def derive(formats: Formats) -> Pipeline:
    """The steps of a run whose base and sides have these formats (pure; see the module docstring)."""
    steps: list[StepSpec] = []
    source, fmt = "base_ckpt", formats.base
    if formats.base_trained:
        steps.append(_base_train())
        if fmt in BF16_EXPORT:
            steps.append(_convert_bf16())
            source = "bf16_ckpt"
    loads: dict[Side, str] = {}
    conversions: dict[CheckpointFormat, StepSpec] = {}
    for s in SIDES:
        accepted = formats.loads[s.name]
        if not accepted:
            raise PipelineError(f"the {s.label} side loads no checkpoint format")
        if fmt in accepted:
            loads[s.name] = source
            continue
        target = accepted[0]
        conversions.setdefault(target, _convert(source, fmt, target))
        loads[s.name] = checkpoint_artifact(target)
    steps += conversions.values()
    sides_in = tuple(dict.fromkeys(loads[s.name] for s in SIDES))
    steps.append(StepSpec("early_gate", "controller", ("data", *sides_in), (Output("gate_report", "."),),
                          "train both sides 2 steps from their starting weights; step-1 losses must agree",
                          executor="gate", timeout_s=2 * HOUR_S, optional=True))
    # the reference side first (pipeline order: `--from gpu_train` re-runs the NPU side's training too); it waits
    # for the gate, which exists to stop the long trainings from starting in vain
    for s in sorted(SIDES, key=lambda s: s.compared_as != "reference"):
        steps.append(_aligned(s, loads[s.name], ("early_gate",) if s.compared_as == "reference" else ()))
    steps.append(StepSpec("compare", "controller", tuple(s.log for s in SIDES), (Output("report", "."),),
                          "compare both logs against the acceptance criteria; write the report", executor="compare"))
    steps.append(StepSpec("diagnose", "controller", ("data", *sides_in), (Output("diagnosis", "."),),
                          "re-run one training step on both sides with tensor dumps; name the first divergent "
                          "module and why", executor="diagnose", timeout_s=2 * HOUR_S, optional=True))
    return Pipeline(tuple(steps), formats)


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The steps of one experiment's runs, in pipeline order, and the formats they were derived from."""

    steps: tuple[StepSpec, ...]
    formats: Formats | None = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def step(self, name: str) -> StepSpec:
        """The step called `name`; the error lists the steps this pipeline has (and the closest one)."""
        for s in self.steps:
            if s.name == name:
                return s
        if name in STEP_NAMES:
            raise PipelineError(f"step '{name}' is not part of this experiment's pipeline (derived from its "
                                f"checkpoint formats); its steps are: {', '.join(self.names)}")
        hint = difflib.get_close_matches(name, STEP_NAMES, n=1)
        did = f"did you mean '{hint[0]}'? " if hint else ""
        raise PipelineError(f"unknown step '{name}'; {did}steps are: {', '.join(self.names)}")

    def training(self, side_name: Side) -> StepSpec:
        """The side's compared training (`npu_reload_train`, `gpu_train`)."""
        return self.step(side(side_name).training)

    def load(self, side_name: Side) -> str:
        """The checkpoint artifact the side's trainings load."""
        load = self.training(side_name).load
        assert load is not None
        return load

    def load_format(self, side_name: Side) -> CheckpointFormat:
        """The format of the checkpoint the side's trainings load."""
        load = self.load(side_name)
        made = self.producer(load)
        if made is not None and made.converts is not None:
            return made.converts[1]
        assert self.formats is not None, "a pipeline that was not derived knows no formats"
        return self.formats.base

    def producer(self, artifact: str) -> StepSpec | None:
        """The step that produces `artifact` (None for a run input: the data, a given base)."""
        for s in self.steps:
            if artifact in s.output_names:
                return s
        return None

    def upstream(self, name: str) -> list[str]:
        """Steps whose outputs `name` reads directly."""
        found = []
        for artifact in self.step(name).inputs:
            p = self.producer(artifact)
            if p is not None and p.name not in found:
                found.append(p.name)
        return found

    def downstream(self, names: Iterable[str]) -> list[str]:
        """`names` and every step that depends on them, transitively, in pipeline order."""
        selected = {self.step(n).name for n in names}
        changed = True
        while changed:
            changed = False
            for s in self.steps:
                if s.name not in selected and any(u in selected for u in self.upstream(s.name)):
                    selected.add(s.name)
                    changed = True
        return [s for s in self.names if s in selected]

    def upstream_closure(self, names: Iterable[str]) -> list[str]:
        """Every step whose outputs `names` need, transitively (not `names` themselves), in pipeline order."""
        wanted = {self.step(n).name for n in names}
        needed: set[str] = set()
        todo = list(wanted)
        while todo:
            for u in self.upstream(todo.pop()):
                if u not in needed and u not in wanted:
                    needed.add(u)
                    todo.append(u)
        return [s for s in self.names if s in needed]

    def plan(
        self,
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
        enabled = {self.step(n).name for n in enabled_optional} | {self.step(n).name for n in named
                                                                   if self.step(n).optional}
        active = [s.name for s in self.steps if not s.optional or s.name in enabled]
        forced: set[str] = set()
        if force:
            forced |= set(self.downstream(force))
        if from_step is not None:
            start = self.names.index(self.step(from_step).name)
            forced |= {n for n in self.names[start:] if n in active}
        reuse_only = set(self.upstream_closure(only)) if only else set()
        selected = [n for n in active if n in set(only) | reuse_only] if only else active
        return Plan(steps=tuple(selected),
                    forced=frozenset(n for n in forced if n in selected and n not in reuse_only),
                    reuse_only=frozenset(reuse_only), pipeline=self)


@dataclass(frozen=True, slots=True)
class Plan:
    """Which steps a run walks, which of them must run even when a cached result exists, and which may only be
    reused (the upstream steps of an `--only` selection: they supply their recorded outputs, never execute); the
    pipeline they belong to."""

    steps: tuple[str, ...]
    forced: frozenset[str]
    reuse_only: frozenset[str] = frozenset()
    pipeline: Pipeline = field(default_factory=lambda: _default(), compare=False)

    def ready(self, done: Collection[str], started: Collection[str]) -> list[str]:
        """Steps of the plan that may start now: not started, and every step of the plan they read from done.

        A step whose producer is not in the plan (`--only`) takes that input from a cached or parent run, so it
        does not wait for it. This one rule is the pipeline's concurrency: there is no list of steps that run
        side by side.
        """
        planned = set(self.steps)
        dag = self.pipeline
        return [n for n in self.steps
                if n not in done and n not in started
                and all(u in done for u in (*dag.upstream(n), *dag.step(n).after) if u in planned)]


def _default() -> Pipeline:
    return DEFAULT


DEFAULT = derive(Formats(base="mindformers", base_trained=True, loads={"npu": ("mindformers",), "gpu": ("megatron",)}))
"""The classic pipeline (the embedded default's): MindFormers base trained on the NPU side, a Megatron GPU side."""

_CATALOG: dict[str, StepSpec] = {
    s.name: s
    for s in (*DEFAULT.steps[:2], *(_convert("bf16_ckpt", "mindformers", f) for f in CHECKPOINT_FORMATS),
              *DEFAULT.steps[3:])
}
STEP_NAMES: tuple[str, ...] = tuple(_CATALOG)
"""Every step any pipeline can have, in pipeline order (the names `steps:` overrides, `--only` and forms accept)."""


def known_step(name: str) -> StepSpec:
    """The role, executor, outputs and time limit of the step called `name` in any pipeline; what it reads depends
    on the experiment (`Pipeline.step`). The error lists the steps that exist (and the closest one)."""
    try:
        return _CATALOG[name]
    except KeyError:
        close = difflib.get_close_matches(name, STEP_NAMES, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise PipelineError(f"unknown step '{name}'; {hint}steps are: {', '.join(STEP_NAMES)}") from None


def producer(artifact: str) -> StepSpec | None:
    """The step that produces `artifact` in any pipeline (each artifact has one producing step name); None for a
    run input (data; a base given as a file)."""
    for s in _CATALOG.values():
        if artifact in s.output_names:
            return s
    return None

