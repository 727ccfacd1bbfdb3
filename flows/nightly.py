"""The nightly regression flow: run a set of experiments, compare each with its last passing run, fail if worse.

Each experiment runs as a subflow of the alignment flow (its own flow run in the UI, with its own artifacts),
one after another: the experiments of a nightly usually share hosts, and a queue on the hosts would only make the
runs slower and their timings noisier. After each run, `alignflow.regression` compares its verdict and every
criterion's value with the experiment's last passing run (`store.last_passing_run`). The summary is published
as a markdown artifact and a table artifact; the flow run ends in a Failed-type state named `Regressed`, whose
message names each regressed experiment and why, when anything regressed; `nightly.yaml`'s `alert` makes
`alignflow serve` install the automation that sends that message to a webhook (`flows.alerts`).

No `from __future__ import annotations` in this module (docs/orchestration.md#g4-no-future-annotations-in-flow-modules).
"""

from pathlib import Path
from typing import cast

from prefect import Flow, flow, get_run_logger
from prefect.client.schemas.objects import FlowRun, State
from prefect.states import Completed, Failed
from pydantic import BaseModel, ConfigDict, Field, create_model

from alignflow.config.catalog import ExperimentCatalog, NightlyExport, NightlySettings
from alignflow.errors import AlignflowError
from alignflow.export import NothingToExport
from alignflow.regression import DriftPolicy, RegressionCheck, not_started
from alignflow.runner.control import cancel_run_jobs
from alignflow.runner.session import RunOptions
from flows.alignment import alignment
from flows.artifacts import nightly_message, publish_nightly_artifacts
from flows.launch import experiment_enum
from tasks.context import open_store, state_dir, transport_factory
from tasks.export import export_task
from tasks.regression import regression_task
from tasks.steps import start_run_task

REGRESSED = "Regressed"
EXPORT_FAILED = "Export failed"


class NightlyBase(BaseModel):
    """Settings of one nightly run (the experiment list is added per catalog, as an enum)."""

    model_config = ConfigDict(extra="forbid")

    drift: DriftPolicy = Field(default_factory=DriftPolicy, description="How far a criterion's value may grow "
                               "before it counts as a regression.")
    export: NightlyExport | None = Field(None, description="Export each run to TensorBoard and/or MLflow after "
                                         "its check.")


def _current_marker(flow_run_id: object) -> Path:
    return state_dir() / "nightly-runs" / str(flow_run_id)


def stop_current_experiment(flow: Flow[..., object], flow_run: FlowRun, state: State[object]) -> None:
    """On cancellation or crash of a nightly: kill the jobs of the experiment run in progress, record it cancelled.

    A served flow run's hooks run in the serving process for the top-level flow only (not for its subflows), so
    the nightly needs its own: `run_nightly` keeps `<state>/nightly-runs/<flow run id>` naming the alignflow run
    it is waiting for. Hook arguments are the keywords `flow, flow_run, state`
    (docs/orchestration.md#g7-state-hooks-get-keyword-arguments).
    """
    marker = _current_marker(flow_run.id)
    if not marker.exists():
        return
    run_id = marker.read_text().strip()
    try:
        cancel_run_jobs(open_store(), run_id, transport_factory=transport_factory())
    finally:
        marker.unlink(missing_ok=True)


def run_nightly(entries: list[tuple[str, Path]], hosts: Path, drift: DriftPolicy,
                export: NightlyExport | None = None) -> State[object]:
    """Run every experiment, check each against its last passing run (and export it); Completed or Failed with the
    reasons. A failed export fails the nightly too, after every experiment ran: nobody would see the gap."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    marker = _current_marker(flow_run.id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    checks: list[RegressionCheck] = []
    export_failures: list[str] = []
    for name, path in entries:
        try:
            run_id = cast(str, start_run_task(str(path), str(hosts), RunOptions(trigger="nightly")))
        except AlignflowError as exc:  # a broken file must not hide the other experiments' results
            logger.error("%s: not started: %s", name, exc)
            checks.append(not_started(name, str(exc)))
            continue
        marker.write_text(run_id)
        state = alignment(experiment=str(path), hosts=str(hosts), trigger="nightly", run_id=run_id,
                          return_state=True)
        marker.unlink(missing_ok=True)
        logger.info("%s: run %s ended %s", name, run_id, state.type.value)
        checks.append(regression_task(run_id, drift))
        if export is not None and export.wanted:
            failure = _export(name, run_id, export)
            if failure:
                logger.error(failure)
                export_failures.append(failure)
    publish_nightly_artifacts(checks)
    message = "\n".join([nightly_message(checks), *export_failures])
    if any(c.regressed for c in checks):
        logger.error(message)
        return Failed(name=REGRESSED, message=message)
    if export_failures:
        return Failed(name=EXPORT_FAILED, message=message)
    logger.info(message)
    return Completed(message=message)


def _export(name: str, run_id: str, export: NightlyExport) -> str | None:
    """Export one run; the failure as a line of the nightly's message (a run that never trained has nothing)."""
    tensorboard = export.tensorboard_dir(state_dir())
    try:
        export_task(run_id, str(tensorboard) if tensorboard is not None else None, export.mlflow)
    except NothingToExport as exc:
        get_run_logger().warning("%s: %s", name, exc)
    except (AlignflowError, OSError) as exc:  # OSError: a TensorBoard dir that cannot be written
        return f"{name}: export of run {run_id} failed: {exc}"
    return None


def nightly_run_name() -> str:
    from prefect.runtime import flow_run

    scheduled = flow_run.scheduled_start_time
    return f"nightly-{scheduled:%Y-%m-%d}" if scheduled is not None else "nightly"


def build_nightly_flow(catalog: ExperimentCatalog, hosts: Path, settings: NightlySettings
                       ) -> Flow[..., State[object]]:
    """The nightly regression flow for this catalog; its defaults come from `nightly.yaml` (all experiments when
    the file lists none)."""
    ExperimentName = experiment_enum(catalog)
    files = {name: path for name, path in catalog.files}
    inventory = Path(hosts).resolve()
    chosen = settings.experiments or list(catalog.names)
    NightlyConfig = create_model(  # a class, made per catalog
        "NightlyConfig", __base__=NightlyBase, __doc__="What one nightly run checks.",
        experiments=(list[ExperimentName], Field(  # type: ignore[valid-type]
            default=[ExperimentName(n) for n in chosen], min_length=1,
            description="Experiments to run, in order (each is compared with its own last passing run).")),
    )
    defaults = NightlyConfig(drift=settings.drift, export=settings.export)

    def nightly_regression(config: NightlyConfig = defaults) -> State[object]:
        """Run the nightly experiments and fail when any of them regressed against its last passing run."""
        seen = dict.fromkeys(e.value for e in config.experiments)  # type: ignore[attr-defined]
        # a launch that passes part of `config` (`{"experiments": [...]}`) keeps nightly.yaml's other settings
        given = config.model_fields_set
        return run_nightly([(n, files[n]) for n in seen], inventory,
                           config.drift if "drift" in given else settings.drift,
                           config.export if "export" in given else settings.export)

    return flow(name="nightly-regression", flow_run_name=nightly_run_name, log_prints=True,
                on_cancellation=[stop_current_experiment], on_crashed=[stop_current_experiment])(nightly_regression)
