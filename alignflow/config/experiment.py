"""One experiment file (`experiments/*.yaml`): what to train, where, from which data, judged by which criteria.

An experiment is a short diff over defaults: the model and training sections describe the run once, each side's
backend renders them into its framework's configuration (MindFormers YAML, Megatron flags), and `steps:` only
overrides what differs per step (host, timeout, a command template).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from alignflow import pipeline
from alignflow.config.criteria import Criterion, default_criteria, load_criteria
from alignflow.config.golden import GoldenConfig
from alignflow.config.hosts import EnvName, Inventory, Role
from alignflow.config.model import ModelConfig, TrainingConfig
from alignflow.config.parallel import ParallelConfig
from alignflow.config.sides import SideConfig, parse_side
from alignflow.config.variants import Matrix, patched_document, run_name
from alignflow.config.yamlsource import KeyPath, YamlDocument, load_yaml, problem_from_error, validate
from alignflow.errors import ConfigError, did_you_mean
from alignflow.pipeline import SIDE_NAMES, SIDES, CheckpointFormat, Side
from alignflow.state import expand_state_dir

_SHA256_HEX = frozenset("0123456789abcdef")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataGenerate(_Strict):
    """Synthetic token data made by `alignflow twin make-data` when the file is absent (twin only)."""

    tokens: int = Field(ge=1, description="Number of tokens to generate.")
    seed: int = Field(0, ge=0, description="Generator seed.")
    documents: Literal["split", "one"] = Field(
        "split", description="split: documents end at the last token id (the twin's data); one: the whole stream is "
        "one document (what the MindFormers CPU lab's `alignflow.labs.mindformers_cpu.data` writes, byte for byte).")


class DataConfig(_Strict):
    """The one data file both trainings read."""

    path: str = Field(description="Data file; relative paths are relative to the experiment file, "
                      "`{state_dir}/...` is under alignflow's state dir.")
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


class ConversionConfig(_Strict):
    """How checkpoints are converted between the base's format and each side's (the steps `convert_<format>`)."""

    spec: str = Field(description="Conversion spec of the model family, MindFormers names -> Megatron's (`alignflow "
                      "convert specs`); the Hugging Face layout is the spec `<spec>-hf` (Hugging Face -> Megatron).")
    iteration: int = Field(1, ge=0, description="Iteration written into a converted Megatron checkpoint.")
    format: Literal["auto", "torch", "torch_dist"] = Field(
        "auto", description="Layout of a converted Megatron checkpoint (`--ckpt-format`): torch = legacy files, one "
        "per tp/pp/ep rank of the loading side's parallel layout; torch_dist = megatron-core's distributed "
        "checkpoint, which loads at any layout; auto = torch for one rank (tp = pp = ep = 1), torch_dist otherwise.")


class BaseGenerate(_Strict):
    """A base checkpoint made with random weights on first use (the `hf` format: by transformers' own class)."""

    seed: int = Field(0, ge=0, description="Seed of the random initialisation.")


class BaseCheckpoint(_Strict):
    """A starting checkpoint both sides load (after conversion where a side loads another format), instead of a
    base training on the NPU side."""

    path: str = Field(description="Checkpoint directory; relative paths are relative to the experiment file, "
                      "`{state_dir}/...` is under alignflow's state dir.")
    format: CheckpointFormat = Field(description="Its format: hf (a save_pretrained directory of safetensors), "
                                     "mindformers, megatron (legacy), torch_dist, dcp (torch.distributed.checkpoint).")
    sha256: str | None = Field(None, description="Expected fingerprint (of the directory); another is refused.")
    generate: BaseGenerate | None = Field(None, description="Make it with random weights when the path is absent "
                                          "(format hf, for the model families transformers has a class for).")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != 64 or not set(value.lower()) <= _SHA256_HEX):
            raise ValueError("sha256 must be 64 hexadecimal characters")
        return value.lower() if value else value


class StepConfig(_Strict):
    """Per-step overrides."""

    host: str | None = Field(None, description="Host name from hosts.yaml; default: the experiment's host of the "
                             "step's role.")
    timeout_s: float | None = Field(None, gt=0, description="Wall-clock limit of the step's job.")
    command: list[str] | None = Field(
        None, description="Command template (argv) replacing the backend's; `{python}`, `{out}` and `{in:NAME}` are "
        "filled in with host paths (in the script of `[bash, -c, SCRIPT]` each becomes one shell-quoted word: write "
        "them bare, not in quotes)."
    )
    outputs: list[str] | None = Field(
        None, description="Declared outputs (artifact names) that the step must produce; each must be one of the "
        "step's outputs. Every output of a step is always required and fingerprinted."
    )
    env: dict[EnvName, str] = Field(default_factory=dict, description="Extra environment for this step.")
    retry_on: list[Literal["timeout", "preempted"]] = Field(
        default_factory=list, description="Ends of the step's job that the run retries with a new job: timeout "
        "(a scheduler's time limit, Slurm TIMEOUT) and preempted (Slurm PREEMPTED). Without them both are "
        "failures.")


class DiagnoseConfig(_Strict):
    """The `diagnose` step: one training step re-run on both sides with tensor dumps, compared module by module."""

    step: int | None = Field(None, ge=1, description="The training step to re-run (its batch and learning rate); left "
                             "out: the first step whose update has a learning rate above 0 (a warm-up from 0 hides "
                             "optimizer differences at step 1).")
    dump_budget_bytes: int = Field(2 * 10**9, ge=1, description="Largest dump per side; a larger one is refused "
                                   "before anything is written.")
    on_gate_failure: bool = Field(True, description="Diagnose automatically when the early gate fails (twin "
                                  "backends; the real frameworks dump through msprobe: `alignflow diagnose-setup`).")


class GateConfig(_Strict):
    """Early gate: a short training of both sides from the converted weights before the long ones."""

    enabled: bool | None = Field(None, description="Run the gate; default: on for real backends, off for the twin.")
    steps: int = Field(2, ge=1, description="Steps of the gate trainings.")
    rel_tol: float = Field(5e-5, gt=0, description="Step-1 relative tolerance (docs/seeds.md#early-gate: 0.005%).")
    metrics: list[str] = Field(default_factory=lambda: ["lm_loss", "mtp_1_loss"], description="Metrics checked.")


def _unset(value: object) -> bool:
    return value is None


def _default_golden(value: object) -> bool:
    return value == GoldenConfig()


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
    npu: SerializeAsAny[SideConfig] = Field(
        default_factory=lambda: parse_side(None, "npu"), description="NPU side (the tested one): its backend "
        "(`kind`) and that backend's settings.")
    gpu: SerializeAsAny[SideConfig] = Field(
        default_factory=lambda: parse_side(None, "gpu"), description="GPU side (the reference): its backend "
        "(`kind`) and that backend's settings.")
    base: BaseCheckpoint | None = Field(
        None, description="A starting checkpoint both sides load; without it the NPU side trains one "
        "(npu_base_train).")
    conversion: ConversionConfig | None = Field(
        None, description="The model family's conversion spec: needed when the pipeline converts a checkpoint "
        "(the sides load other formats than the base's) or diagnoses one side in the other's names.")
    steps: dict[str, StepConfig] = Field(default_factory=dict, description="Per-step overrides by step name.")
    criteria: list[Criterion] = Field(default_factory=default_criteria, description="Acceptance criteria: a list, "
                                      "or {noise_runs: N, rules: [...]} to measure the reference side's noise floor; "
                                      "a list may be a criteria file's name (`criteria: FILE`, relative to the "
                                      "experiment), read when the experiment is loaded.")
    noise_runs: int | None = Field(None, ge=2, description="Trainings of the reference side that measure its "
                                   "self-noise (`criteria.noise_runs`; `alignflow noise`).")
    gate: GateConfig = Field(default_factory=GateConfig, description="Early gate after conversion.")
    diagnose: DiagnoseConfig = Field(default_factory=DiagnoseConfig, description="Tensor-level diagnosis.")
    preflight: bool = Field(
        True, description="Compare both sides' settings before step 1 and refuse to run on a mismatch. Turn off "
        "only for experiments whose training commands preflight cannot read (replaced commands, benchmarks); "
        "the run records that it was not checked."
    )
    # `variants` and `golden` are left out of the recorded configuration while unset: an experiment without them
    # keeps the configuration (and fingerprint) it recorded before they existed (`exclude_if`, not a model
    # serializer: pydantic's model serializers turn a NaN into null, which would let a NaN past the store's JSON check)
    variants: Matrix | None = Field(None, exclude_if=_unset,
                                    description="A switch matrix: a reference and named variants (patches of "
                                    "this experiment), each trained and compared with its reference, side by side "
                                    "(alignflow.config.variants).")
    golden: GoldenConfig = Field(default_factory=GoldenConfig, exclude_if=_default_golden,
                                 description="Margins of `alignflow golden check`: "
                                 "each side against its own golden values (alignflow.config.golden).")
    source: str | None = Field(None, exclude=True, description="File the experiment was read from.")

    @model_validator(mode="before")
    @classmethod
    def _criteria_section(cls, data: Any) -> Any:
        """`criteria: {noise_runs: 3, rules: [...]}` is the list form plus the number of noise runs."""
        if isinstance(data, dict) and isinstance(data.get("criteria"), dict):
            section = dict(data["criteria"])
            unknown = sorted(set(section) - {"noise_runs", "rules"})
            if unknown:
                raise ValueError(f"criteria: unknown key(s) {', '.join(unknown)}; a criteria mapping has noise_runs "
                                 "and rules")
            data = {**data, "noise_runs": section.get("noise_runs")}
            if "rules" in section:
                data["criteria"] = section["rules"]
            else:
                data.pop("criteria")
        return data

    @field_validator("steps")
    @classmethod
    def _known_steps(cls, value: dict[str, StepConfig]) -> dict[str, StepConfig]:
        unknown = sorted(set(value) - set(pipeline.STEP_NAMES))
        if unknown:
            hints = "".join(did_you_mean(u, pipeline.STEP_NAMES) for u in unknown[:1])
            raise ValueError(f"unknown step(s) {', '.join(unknown)}{hints}; steps are: "
                             f"{', '.join(pipeline.STEP_NAMES)}")
        for name, config in value.items():
            # every output of a step is required (the runner fingerprints each one on its host and fails the step
            # when one is missing); a declared name the step never produces is a mistake, not a wish
            produced = pipeline.known_step(name).output_names
            foreign = sorted(set(config.outputs or ()) - set(produced))
            if foreign:
                raise ValueError(f"steps.{name}.outputs: {', '.join(foreign)} not produced by {name} (it produces "
                                 f"{', '.join(produced)})")
        return value

    @field_validator("npu", "gpu", mode="before")
    @classmethod
    def _side(cls, value: Any, info: ValidationInfo) -> SideConfig:
        return parse_side(value, str(info.field_name))

    @model_validator(mode="after")
    def _data_files(self) -> Experiment:
        if self.data.prefix is None:
            raise ValueError(f"data: prefix missing: the data must be a Megatron indexed dataset "
                             f"(<path>/<prefix>.bin + <prefix>.idx) — data.path {self.data.path!r} is its directory; "
                             "make one with `alignflow data make DIR/PREFIX` (or --from-npy for a .npy token file)")
        if self.data.path.endswith((".npy", ".tokens", ".bin", ".idx")):
            raise ValueError(f"data.path {self.data.path!r} names a file: it is the directory holding "
                             f"{self.data.prefix}.bin and {self.data.prefix}.idx (a Megatron indexed dataset)")
        return self

    @model_validator(mode="after")
    def _layouts(self) -> Experiment:
        problems = []
        for side in SIDE_NAMES:
            layout = self.parallel(side)
            problems += layout.problems(
                micro_batch_size=self.training.micro_batch_size, global_batch_size=self.training.global_batch_size,
                num_experts=self.model.moe.num_experts if self.model.moe else None, num_layers=self.model.num_layers,
                num_attention_heads=self.model.num_attention_heads, where=f"{side} layout")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def side(self, name: Side) -> SideConfig:
        """The section of side `name` (`npu`, `gpu`)."""
        return self.npu if name == "npu" else self.gpu

    def parallel(self, side: Side) -> ParallelConfig:
        """The side's parallel layout: `npu.parallel` / `gpu.parallel`, else `training.parallel`."""
        return self.side(side).parallel or self.training.parallel

    @property
    def base_dir(self) -> Path:
        return Path(self.source).parent if self.source else Path.cwd()

    @property
    def spec_ref(self) -> str:
        """`conversion.spec` as every reader must take it: a packaged spec's name as it is, a spec file's absolute
        path (relative to the experiment file, not to the working directory of whoever reads it)."""
        if self.conversion is None:
            raise ConfigError(f"{self.source or self.name}: no conversion spec (`conversion: {{spec: ...}}`)")
        spec = self.conversion.spec
        return str(self.resolve_path(spec)) if spec.endswith((".yaml", ".yml")) else spec

    def resolve_path(self, path: str) -> Path:
        """A path of the experiment file, relative to that file (`{state_dir}/...`: under the state dir)."""
        p = Path(expand_state_dir(path)).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()


def experiment_name(path: str | Path) -> str:
    """The `name:` an experiment file gives, read without validating the file: what a flow run is called before its
    run is recorded (then from the validated experiment), so that Prefect's first log lines and the CLI name it
    alike (issue 47: `_ux_ctrlc.yaml` was `align-_ux_ctrlc-…` by its file and `align-ux-ctrlc-…` by its name). The
    file's stem when the file cannot be read or gives no name."""
    try:
        data = load_yaml(path).data
    except ConfigError:
        data = None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else Path(path).stem


def load_experiment(path: str | Path, inventory: Inventory | None = None) -> Experiment:
    """Load and validate an experiment and resolve every name it refers to (`alignflow.config.names`: spec,
    flavour, template, data prefix, criteria file); with an inventory, host references are checked against it too.
    Every problem found is raised at once, each with its file and line."""
    from alignflow.config.names import resolve_names

    doc = with_criteria_file(load_yaml(path))
    experiment = validate(Experiment, doc).model_copy(update={"source": str(Path(path).resolve())})
    problems = resolve_names(experiment, doc.lines)
    try:
        check_variants(doc, experiment)
    except ConfigError as exc:
        problems += exc.problems
    if inventory is not None:
        try:
            check_hosts(experiment, inventory, doc_lines=doc.lines)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    if inventory is not None:
        experiment = with_gpu_host_extensions(experiment, inventory)
    return experiment


def with_criteria_file(doc: YamlDocument) -> YamlDocument:
    """`criteria: FILE` (or `criteria: {rules: FILE, ...}`): the criteria of a criteria file (`criteria: [...]`,
    as `alignflow compare --criteria` reads), relative to the experiment, written into the experiment as a list —
    so the run records the criteria themselves, not a name whose file may change."""
    data = doc.data
    if not isinstance(data, dict):
        return doc
    section = data.get("criteria")
    loc: tuple[str, ...] = ("criteria",)
    if isinstance(section, dict) and isinstance(section.get("rules"), str):
        name, loc = section["rules"], ("criteria", "rules")
    elif isinstance(section, str):
        name = section
    else:
        return doc
    from alignflow.config.names import closest_file

    file = Path(expand_state_dir(name)).expanduser()
    file = file if file.is_absolute() else (doc.path.parent / file).resolve()
    if not file.is_file():
        raise ConfigError([(str(doc.path), doc.line_of(loc), f"{'.'.join(loc)}: criteria file {name!r} not found "
                            f"({file}){closest_file(file, name)}")])
    rules = [c.model_dump(mode="json") for c in load_criteria(file)]
    new = {**section, "rules": rules} if isinstance(section, dict) else rules
    return YamlDocument(path=doc.path, data={**data, "criteria": new}, lines=doc.lines)


def with_gpu_host_extensions(experiment: Experiment, inventory: Inventory) -> Experiment:
    """Each side's `extensions` (a backend that has the field: Megatron, the PyTorch twin) filled in from the
    `cuda_extensions` of the host its training runs on, when the experiment leaves it out and that host is known
    (`steps.<training>.host`, `hosts.<role>`, or the inventory's only host of the side's role)."""
    update: dict[str, SideConfig] = {}
    for s in SIDES:
        cfg = experiment.side(s.name)
        if "extensions" not in type(cfg).model_fields or getattr(cfg, "extensions", None) is not None:
            continue
        override = experiment.steps.get(s.training)
        name = override.host if override is not None and override.host else experiment.hosts.get(s.role)
        same_role = [h for h in inventory.hosts.values() if h.role == s.role]
        host = inventory.hosts.get(name) if name else (same_role[0] if len(same_role) == 1 else None)
        if host is not None:
            update[s.name] = cfg.model_copy(update={"extensions": list(host.cuda_extensions)})
    return experiment.model_copy(update=update) if update else experiment


def check_hosts(experiment: Experiment, inventory: Inventory, *, doc_lines: dict[Any, int] | None = None) -> None:
    """Every host an experiment names exists in the inventory and has the role it is used for."""
    lines = doc_lines or {}
    src = experiment.source or "experiment"
    problems: list[tuple[str, int | None, str]] = []
    known = ", ".join(sorted(inventory.hosts))
    for role, name in experiment.hosts.items():
        if name not in inventory.hosts:
            problems.append((src, lines.get(("hosts", role)), f"hosts.{role}: unknown host '{name}'"
                             f"{did_you_mean(name, inventory.hosts)}; "
                             f"{inventory.source or 'hosts.yaml'} defines: {known}"))
        elif inventory.hosts[name].role != role:
            problems.append((src, lines.get(("hosts", role)),
                             f"hosts.{role}: host '{name}' has role {inventory.hosts[name].role}, not {role}"))
    for step, cfg in experiment.steps.items():
        if cfg.host is not None and cfg.host not in inventory.hosts:
            problems.append((src, lines.get(("steps", step, "host")),
                             f"steps.{step}.host: unknown host '{cfg.host}'"
                             f"{did_you_mean(cfg.host, inventory.hosts)}; "
                             f"{inventory.source or 'hosts.yaml'} defines: {known}"))
    if problems:
        raise ConfigError(problems)


def variant_experiment(experiment: Experiment, group: str, config: str | None) -> Experiment:
    """The validated `Experiment` of one training of `experiment`'s matrix (see `patched_document`)."""
    matrix = experiment.variants
    assert matrix is not None, "variant_experiment of an experiment without variants"
    name = config or matrix.reference
    doc = patched_document(experiment.model_dump(mode="json"), matrix, group, config)
    doc["name"] = run_name(experiment.name, group, name, grouped=bool(matrix.groups))
    try:
        return Experiment.model_validate(doc).model_copy(update={"source": experiment.source})
    except ValidationError as exc:  # checked when the file was loaded; a recorded run of an older alignflow may differ
        first = exc.errors()[0]
        raise ConfigError(f"{experiment.source}: variant {name} of group {group}: "
                          f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


def check_variants(doc: YamlDocument, experiment: Experiment) -> None:
    """Validate every training of the matrix as a whole experiment; every problem as `file:line: key: message`,
    at the line of the patch that causes it (or of the experiment, when the patch only exposes it)."""
    matrix = experiment.variants
    if matrix is None or not isinstance(doc.data, dict):
        return
    problems: list[tuple[str, int | None, str]] = []
    group_base: KeyPath = ("variants", "groups")
    config_base: KeyPath = ("variants", "configs")
    for group in matrix.group_names:
        for config in [None, *matrix.configs_in(group)]:
            patched = patched_document(doc.data, matrix, group, config)
            try:
                Experiment.model_validate(patched)
            except ValidationError as exc:
                label = f"variant {config}" if config else f"reference {matrix.reference}"
                in_group = f" in group {group}" if matrix.groups else ""
                for err in exc.errors(include_url=False):
                    where = _patch_location(doc, tuple(err["loc"]), (*group_base, group, "patch"),
                                            (*config_base, config, "patch") if config else None)
                    if not where and not err["loc"]:  # a rule of the whole experiment: the patch exposed it
                        where = (*config_base, config, "patch") if config else (*group_base, group, "patch")
                    path, line, message = problem_from_error(err, doc, model=Experiment, prefix=where)
                    problems.append((path, line, f"{message} ({label}{in_group})"))
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))


def _patch_location(doc: YamlDocument, loc: tuple[Any, ...], group_patch: KeyPath, config_patch: KeyPath | None
                    ) -> KeyPath:
    """Where the value at `loc` of a patched experiment was written: the config's patch, the group's, or the
    experiment itself (the longest prefix of `loc` that one of them writes)."""
    for base in (config_patch, group_patch):
        if base is None:
            continue
        for end in range(len(loc), 0, -1):
            if (*base, *loc[:end]) in doc.lines:
                return base
    return ()
