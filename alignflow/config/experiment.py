"""One experiment file (`experiments/*.yaml`): what to train, where, from which data, judged by which criteria.

An experiment is a short diff over defaults: the model and training sections describe the run once, each side's
backend renders them into its framework's configuration (MindFormers YAML, Megatron flags), and `steps:` only
overrides what differs per step (host, timeout, a command template).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alignflow import pipeline
from alignflow.compare.criteria import Criterion, default_criteria
from alignflow.config.hosts import Inventory, Role
from alignflow.config.model import ModelConfig, TrainingConfig
from alignflow.config.yamlsource import load_yaml, validate
from alignflow.errors import ConfigError

_SHA256_HEX = frozenset("0123456789abcdef")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataGenerate(_Strict):
    """Synthetic token data made by `alignflow reference make-data` when the file is absent (twin only)."""

    tokens: int = Field(ge=1, description="Number of tokens to generate.")
    seed: int = Field(0, ge=0, description="Generator seed.")


class DataConfig(_Strict):
    """The one data file both trainings read."""

    path: str = Field(description="Data file; relative paths are relative to the experiment file.")
    sha256: str | None = Field(None, description="Expected sha256 (hex); a file that hashes otherwise is refused.")
    generate: DataGenerate | None = Field(None, description="Make the file with the twin's generator if absent.")
    prefix: str | None = Field(
        None, description="Megatron indexed data: `path` is a directory holding `<prefix>.bin` and `<prefix>.idx` "
        "(both fingerprinted) and the trainings read `<path>/<prefix>`."
    )
    host_paths: dict[str, str] = Field(
        default_factory=dict, description="Where the same data already lives on a training host, by role (ascend, "
        "cuda): verified by sha256 there instead of copied."
    )

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != 64 or not set(value.lower()) <= _SHA256_HEX):
            raise ValueError("sha256 must be 64 hexadecimal characters")
        return value.lower() if value else value


class NpuBackend(_Strict):
    """How the NPU side runs: the reference twin (MindSpore) or MindFormers."""

    kind: Literal["reference", "mindformers"] = Field("reference", description="Backend of the NPU side.")
    template: str | None = Field(
        None, description="MindFormers YAML template (relative to the experiment file); alignflow overrides "
        "load/save paths, steps, seed and determinism in it."
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Dotted-key overrides applied last to the rendered YAML."
    )
    entry: str | None = Field(None, description="Path of run_mindformer.py on the host (mindformers only).")
    msrun: dict[str, Any] | None = Field(
        None, description="Run under msrun with these options (worker_num, local_worker_num, master_port, log_dir)."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the NPU trainings.")
    repo: str = Field("mindformers", description="Name under the host's `repos:` whose git commit versions the NPU "
                      "side (part of each step's cache key).")


class GpuBackend(_Strict):
    """How the GPU side runs: the reference twin (PyTorch) or Megatron-LM."""

    kind: Literal["reference", "megatron"] = Field("reference", description="Backend of the GPU side.")
    entry: str | None = Field(None, description="Path of pretrain_gpt.py on the host (megatron only).")
    torchrun: dict[str, Any] | None = Field(
        None, description="Run under torchrun with these options (nproc_per_node, master_port)."
    )
    transformer_impl: Literal["local", "transformer_engine"] = Field(
        "local", description="`--transformer-impl`; also picks the converted checkpoint's flavour."
    )
    megatron_version: str = Field("0.16", description="megatron-core version on the GPU host (names the MTP layer).")
    extra_args: list[str] = Field(default_factory=list, description="Flags appended to the generated ones.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the GPU training.")
    repo: str = Field("megatron-lm", description="Name under the host's `repos:` whose git commit versions the GPU "
                      "side (part of each step's cache key).")


class ConversionConfig(_Strict):
    """How the bf16 checkpoint becomes a Megatron checkpoint."""

    spec: str = Field(description="Conversion spec name (see `alignflow convert specs`).")
    iteration: int = Field(1, ge=0, description="Iteration written into the Megatron checkpoint.")


class StepConfig(_Strict):
    """Per-step overrides."""

    host: str | None = Field(None, description="Host name from hosts.yaml; default: the experiment's host of the "
                             "step's role.")
    timeout_s: float | None = Field(None, gt=0, description="Wall-clock limit of the step's job.")
    command: list[str] | None = Field(
        None, description="Command template (argv) replacing the backend's; `{placeholders}` are filled in."
    )
    outputs: list[str] | None = Field(
        None, description="Declared outputs (artifact names) that the step must produce; each must be one of the "
        "step's outputs. Every output of a step is always required and fingerprinted."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for this step.")


class GateConfig(_Strict):
    """Early gate: a short training of both sides from the converted weights before the long ones."""

    enabled: bool | None = Field(None, description="Run the gate; default: on for real backends, off for the twin.")
    steps: int = Field(2, ge=1, description="Steps of the gate trainings.")
    rel_tol: float = Field(5e-5, gt=0, description="Step-1 relative tolerance (seed 001 §6.4: 0.005%).")
    metrics: list[str] = Field(default_factory=lambda: ["lm_loss", "mtp_1_loss"], description="Metrics checked.")


class Experiment(_Strict):
    """A whole experiment file."""

    name: str = Field(description="Experiment name (unique in the store).")
    description: str = Field("", description="What this experiment is for.")
    hosts: dict[Role, str] = Field(
        default_factory=dict, description="Host name per role; a role left out takes the inventory's only host of "
        "that role."
    )
    data: DataConfig = Field(description="The data file both sides read.")
    model: ModelConfig = Field(description="The architecture both sides train.")
    training: TrainingConfig = Field(description="Optimisation and data order.")
    npu: NpuBackend = Field(default_factory=NpuBackend, description="NPU side.")
    gpu: GpuBackend = Field(default_factory=GpuBackend, description="GPU side.")
    conversion: ConversionConfig = Field(description="bf16 -> Megatron conversion.")
    steps: dict[str, StepConfig] = Field(default_factory=dict, description="Per-step overrides by step name.")
    criteria: list[Criterion] = Field(default_factory=default_criteria, description="Acceptance criteria.")
    gate: GateConfig = Field(default_factory=GateConfig, description="Early gate after conversion.")
    preflight: bool = Field(
        True, description="Compare both sides' settings before step 1 and refuse to run on a mismatch. Turn off "
        "only for experiments whose training commands preflight cannot read (replaced commands, benchmarks); "
        "the run records that it was not checked."
    )
    source: str | None = Field(None, exclude=True, description="File the experiment was read from.")

    @field_validator("steps")
    @classmethod
    def _known_steps(cls, value: dict[str, StepConfig]) -> dict[str, StepConfig]:
        unknown = sorted(set(value) - set(pipeline.STEP_NAMES))
        if unknown:
            raise ValueError(f"unknown step(s) {', '.join(unknown)}; steps are: {', '.join(pipeline.STEP_NAMES)}")
        for name, config in value.items():
            # every output of a step is required (the runner fingerprints each one on its host and fails the step
            # when one is missing); a declared name the step never produces is a mistake, not a wish
            produced = pipeline.step(name).outputs
            foreign = sorted(set(config.outputs or ()) - set(produced))
            if foreign:
                raise ValueError(f"steps.{name}.outputs: {', '.join(foreign)} not produced by {name} (it produces "
                                 f"{', '.join(produced)})")
        return value

    @model_validator(mode="after")
    def _backend_files(self) -> Experiment:
        if self.npu.kind == "mindformers" and not (self.npu.template and self.npu.entry):
            raise ValueError("npu: backend mindformers needs template and entry")
        if self.gpu.kind == "megatron" and not self.gpu.entry:
            raise ValueError("gpu: backend megatron needs entry (path of pretrain_gpt.py)")
        return self

    @property
    def base_dir(self) -> Path:
        return Path(self.source).parent if self.source else Path.cwd()

    def resolve_path(self, path: str) -> Path:
        """A path of the experiment file, relative to that file."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()


def load_experiment(path: str | Path, inventory: Inventory | None = None) -> Experiment:
    """Load and validate an experiment; with an inventory, host references are checked against it too."""
    doc = load_yaml(path)
    experiment = validate(Experiment, doc).model_copy(update={"source": str(Path(path).resolve())})
    if inventory is not None:
        check_hosts(experiment, inventory, doc_lines=doc.lines)
    return experiment


def check_hosts(experiment: Experiment, inventory: Inventory, *, doc_lines: dict[Any, int] | None = None) -> None:
    """Every host an experiment names exists in the inventory and has the role it is used for."""
    lines = doc_lines or {}
    src = experiment.source or "experiment"
    problems: list[tuple[str, int | None, str]] = []
    known = ", ".join(sorted(inventory.hosts))
    for role, name in experiment.hosts.items():
        if name not in inventory.hosts:
            problems.append((src, lines.get(("hosts", role)), f"hosts.{role}: unknown host '{name}'; "
                             f"{inventory.source or 'hosts.yaml'} defines: {known}"))
        elif inventory.hosts[name].role != role:
            problems.append((src, lines.get(("hosts", role)),
                             f"hosts.{role}: host '{name}' has role {inventory.hosts[name].role}, not {role}"))
    for step, cfg in experiment.steps.items():
        if cfg.host is not None and cfg.host not in inventory.hosts:
            problems.append((src, lines.get(("steps", step, "host")),
                             f"steps.{step}.host: unknown host '{cfg.host}'; "
                             f"{inventory.source or 'hosts.yaml'} defines: {known}"))
    if problems:
        raise ConfigError(problems)
