"""A run of one experiment as the runner sees it: how it was asked for, what was recorded when it started, its
data, and what happened to each step.

Everything a run needs to be executed again is recorded when it starts (`start_run`): the experiment and
inventory as they were, the plan, the trigger and the parent run. `open_run` reads that record back into a
`RunContext`, once per process (the Prefect tasks of a run share it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from alignflow import pipeline
from alignflow.backends.registry import pipeline_for, side_backend
from alignflow.codeversion import code_version_for
from alignflow.config.experiment import Experiment, check_hosts, load_experiment
from alignflow.config.hosts import Inventory, load_hosts
from alignflow.config.placement import CONTROLLER, Placement
from alignflow.errors import ConfigError, FingerprintMismatch, PipelineError
from alignflow.fingerprint import Fingerprinter, HashMemo
from alignflow.pipeline import Pipeline
from alignflow.runner.artifacts import ArtifactRef
from alignflow.store import Store
from alignflow.store.params import RunOptions as RunOptions  # where runs are asked for; recorded with RunParams
from alignflow.store.params import RunParams
from alignflow.store.records import StepStatus

log = logging.getLogger(__name__)

Events = Callable[[str], None]
"""Where the runner says what it is doing (a logger's `info`, the CLI's console, a Prefect run logger)."""


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What happened to one step of a run: `ran` or `cached` (a failure is an exception, recorded by then)."""

    step: str
    status: StepStatus
    artifacts: dict[str, ArtifactRef] = field(default_factory=dict)
    step_run_id: str | None = None
    cache_key: str | None = None
    verdict: str | None = None
    reused_from_run: str | None = None  # the run whose step run a cached outcome reuses
    reused_from_step: str | None = None  # that step run (`step_run_id` is this run's record of the reuse)



@dataclass(frozen=True, slots=True)
class RunContext:
    """A recorded run's experiment, inventory, plan, options and placement, exactly as recorded when it started."""

    run_id: str
    params: RunParams

    @property
    def experiment(self) -> Experiment:
        return self.params.experiment

    @property
    def inventory(self) -> Inventory:
        return self.params.inventory

    @property
    def plan(self) -> pipeline.Plan:
        return self.params.plan

    @property
    def options(self) -> RunOptions:
        return self.params.options

    @property
    def placement(self) -> Placement:
        return self.params.placement

    @property
    def pipeline(self) -> Pipeline:
        """The run's steps, derived from its experiment's checkpoint formats."""
        return self.plan.pipeline


def open_run(store: Store, run_id: str) -> RunContext:
    """The `RunContext` of a recorded alignment run (its parameters as `start_run` recorded them, of any version
    of the store's codec: `alignflow.store.params`)."""
    run = store.get_run(run_id)
    params = run.alignment_params()  # its plan over the pipeline derived from the recorded experiment's formats
    plan = dataclasses.replace(params.plan, pipeline=pipeline_for(params.experiment))
    return RunContext(run_id=run.id, params=params.model_copy(update={"plan": plan}))


def default_state_dir() -> Path:
    """`$ALIGNFLOW_STATE_DIR`, else `./.alignflow` (resolved at call time; see `alignflow.state`)."""
    from alignflow.state import state_dir

    return state_dir()


def prepare_data(experiment: Experiment, *, memo: HashMemo | None, run_id: str | None = None,
                 events: Events | None = None) -> ArtifactRef:
    """The data directory on the controller (a Megatron indexed dataset, `<path>/<prefix>.bin/.idx`): generated when
    the experiment says how and it is absent, by one run while the others wait (`alignflow.once`, issue 49); its
    sha256 checked against the declared one (a different dataset must never be trained on silently)."""
    from alignflow.once import create_once

    path = experiment.resolve_path(experiment.data.path)
    prefix = experiment.data.prefix or ""
    gen = experiment.data.generate
    where = f"{experiment.source}: data"

    def verify(found: Path) -> str:
        # The directory's structure is checked once per content: its sha256 covers every file's name and bytes, so
        # data whose check passed (the memo says so) passes it again; the check reads the index with numpy, which a
        # run would otherwise import for it alone (issue 48). A directory holding more than the dataset is refused
        # by the check before anything is hashed.
        fingerprint = Fingerprinter(memo).fingerprint
        alone = found.is_dir() and {p.name for p in found.iterdir()} == {f"{prefix}.bin", f"{prefix}.idx"}
        if memo is not None and alone:
            sha256 = fingerprint(found).sha256
            if memo.checked(f"indexed dataset {prefix!r}: {sha256}"):
                return sha256
        from alignflow.twin.data import check_data_dir  # numpy

        check_data_dir(found, prefix, where=where)
        sha256 = fingerprint(found).sha256
        if memo is not None:
            memo.mark_checked(f"indexed dataset {prefix!r}: {sha256}")
        return sha256

    if path.exists() or gen is None:
        if gen is None and not path.exists():
            raise ConfigError(f"{experiment.source}: data.path {path} does not exist and data.generate is not set")
        sha256 = verify(path)
    else:
        def build(tmp: Path) -> None:
            from alignflow.twin.data import make_data  # numpy

            log.info("generating %d tokens of synthetic data into %s/%s.bin/.idx", gen.tokens, path, prefix)
            make_data(tmp / prefix, gen.tokens, gen.seed, experiment.model.vocab_size,
                      one_document=gen.documents == "one")

        try:
            sha256 = create_once(path, what=f"the data {path.name}", build=build, verify=verify, run_id=run_id,
                                 events=events).value
        except OSError as exc:
            raise PipelineError(f"{experiment.source}: cannot generate data.path {path}: {exc}") from exc
    size = sum(p.stat().st_size for p in path.iterdir())
    declared = experiment.data.sha256
    if declared is not None and sha256 != declared:
        raise FingerprintMismatch(
            f"{path}: sha256 {sha256} differs from the declared data.sha256 {declared}; "
            "both sides must read the same data", expected=declared, actual=sha256)
    return ArtifactRef(name="data", host=CONTROLLER, path=str(path), sha256=sha256, size=size, kind="data")


def prepare_base(experiment: Experiment, *, memo: HashMemo | None, run_id: str | None = None,
                 events: Events | None = None) -> ArtifactRef | None:
    """The experiment's shared starting checkpoint (`base: {path, format}`) on the controller, fingerprinted: made
    with random weights when `base.generate` says so and it is absent (a Hugging Face checkpoint, by transformers'
    own class of the model's family), by one run while the others wait (`alignflow.once`, issue 49); its sha256
    checked against the declared one. None: the NPU side trains the base (`npu_base_train`)."""
    base = experiment.base
    if base is None:
        return None
    path = experiment.resolve_path(base.path)
    where = f"{experiment.source}: base.path {path}"
    fingerprint = Fingerprinter(memo).fingerprint
    if path.exists():
        fp = fingerprint(path)
    else:
        if base.generate is None:
            raise ConfigError(f"{where} does not exist and base.generate is not set")
        if base.format != "hf":
            raise ConfigError(f"{where}: base.generate makes Hugging Face checkpoints (format hf), not {base.format}")
        from alignflow.convert.hf import make_hf_checkpoint
        from alignflow.once import create_once

        seed = base.generate.seed

        def build(tmp: Path) -> None:
            log.info("generating a %s base checkpoint of %s (seed %d) into %s", base.format, experiment.model.family,
                     seed, path)
            make_hf_checkpoint(experiment.model, tmp, seed=seed)

        try:
            fp = create_once(path, what=f"the base checkpoint {path.name}", build=build, verify=fingerprint,
                             run_id=run_id, events=events).value
        except OSError as exc:
            raise PipelineError(f"{where}: cannot generate it: {exc}") from exc
    if base.sha256 is not None and fp.sha256 != base.sha256:
        raise FingerprintMismatch(f"{path}: sha256 {fp.sha256} differs from the declared base.sha256 {base.sha256}; "
                                  "both sides must start from the same weights", expected=base.sha256,
                                  actual=fp.sha256)
    return ArtifactRef.from_fingerprint("base_ckpt", CONTROLLER, str(path), fp, "checkpoint")


def load_run_inputs(experiment_path: str | Path, hosts_path: str | Path,
                    state_dir: Path | None = None) -> tuple[Experiment, Inventory]:
    """Load and cross-check the experiment and the inventory (local relative workdirs under `state_dir`)."""
    inventory = load_hosts(hosts_path, state_dir=state_dir)
    experiment = load_experiment(experiment_path, inventory)
    check_hosts(experiment, inventory)
    return experiment, inventory


def plan_for(experiment: Experiment, options: RunOptions) -> pipeline.Plan:
    """The run's plan over the experiment's derived pipeline; the early gate is on by default when a side is a
    real framework (a twin's step 1 is checked by its own tests)."""
    gate = experiment.gate.enabled
    if gate is None:
        gate = any(side_backend(experiment, s.name).real for s in pipeline.SIDES)
    return pipeline_for(experiment).plan(enabled_optional=["early_gate"] if gate else [],
                                         from_step=options.from_step, only=options.only, force=options.force)


def compare_code_version() -> str:
    return code_version_for(("logs", "compare", "config/criteria.py"))
