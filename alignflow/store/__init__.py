"""The store: alignflow's system of record (SQLAlchemy 2.x; SQLite by default, PostgreSQL in production).

Where: `$ALIGNFLOW_DB_URL` (e.g. `postgresql+psycopg://alignflow@db/alignflow`), else SQLite at
`<state dir>/store.sqlite`, the state dir being `$ALIGNFLOW_STATE_DIR` or `./.alignflow`. The schema is
managed by Alembic migrations shipped in this package (`alignflow db upgrade`).

Nothing recorded is ever overwritten: a finished run or step run cannot change (`ImmutableRecord`); re-running
creates new rows that point at what they re-run (`parent_id`, `reused_from`). Callers get frozen records, never
ORM objects or sessions. Ids of runs and step runs are 12 hex characters; every `*_id` argument also accepts a
unique prefix of at least 4.

API (all keyword arguments after the first one or two; errors are `StoreError` subclasses):

    Store.open(url=None, *, state_dir=None, upgrade=True, clock=utc_now) -> Store    (also a context manager)
    store.url -> str (password masked);  store.close()

    ensure_experiment(name, *, config, config_sha256) -> ExperimentRecord    a new config sha256 adds a version
    get_experiment(name) -> ExperimentRecord;  experiment_config(name, config_sha256) -> dict

    create_run(experiment, *, parent_id=None, trigger, code_version, params, config_sha256=None) -> RunRecord
        params: RunParams | NoiseRunParams (`alignflow.store.params`, one versioned codec); RunRecord.params
        reads them back from any version, `alignment_params()` those of an alignment run
    finish_run(run_id, *, status, verdict=None, report=None, error=None) -> RunRecord
        status: completed | failed | error | cancelled | crashed; open steps closed as failed (refused if completed)
    get_run(run_id) -> RunRecord;  list_runs(*, experiment=None, status=None, limit=50) -> [RunRecord] newest first
    last_passing_run(experiment, *, before=None, config_sha256=None) -> RunRecord | None   completed, verdict pass
    children(run_id) -> [RunRecord]                                          re-runs of a run

    start_step(run_id, step, *, host, command, cache_key, inputs, status="running"|"pending") -> StepRunRecord
        inputs: name -> ArtifactRef; StepRunRecord.input_ref(name) reads one back
    mark_running(step_run_id) -> StepRunRecord                               pending -> running
    attach_job(step_run_id, *, job_dir, handle) -> StepRunRecord             once, before polling starts
    finish_step(step_run_id, *, status, exit_code, stdout_tail, stderr_tail, error=None) -> StepRunRecord
        status: ran | failed | skipped; tails keep their last 64 KiB
    skip_step(run_id, step, *, reason, host=None) -> StepRunRecord
    find_cached_step(step, cache_key) -> StepRunRecord | None               newest that RAN (never a cached copy)
    record_cached_step(run_id, step, *, host, command, cache_key, reused_from) -> StepRunRecord
        copies the inputs and artifacts of `reused_from` to the new step run
    get_step(step_run_id) -> StepRunRecord;  steps(run_id) -> [StepRunRecord] in creation order

    add_artifact(step_run_id, *, name, host, path, kind, sha256, size_bytes, manifest=None) -> ArtifactRecord
        only while the step run is open (record outputs, then finish_step); one per name
    artifacts(step_run_id) / run_artifacts(run_id) / artifacts_by_sha256(sha256) -> [ArtifactRecord]

    add_snapshot(run_id, host, data) -> SnapshotRecord;  snapshots(run_id) -> [SnapshotRecord]
    add_metrics(run_id, *, source, frame, step_run_id=None) -> int    wide frame in, long rows stored
    metrics(run_id, source=None, *, wide=False) -> DataFrame          long: source, step_run_id, step, metric, value
    add_comparison(run_id, *, verdict, criteria, summary) -> ComparisonRecord;  comparison(run_id) -> ... | None

Snapshots, metrics and comparisons can only be added while their run is running.
"""

from alignflow.store.records import (
    PASS_VERDICT,
    ArtifactRecord,
    ArtifactRef,
    ComparisonRecord,
    ExperimentRecord,
    RunRecord,
    RunStatus,
    SnapshotRecord,
    StepRunRecord,
    StepStatus,
    utc_now,
)
from alignflow.store.store import Store

__all__ = [
    "PASS_VERDICT",
    "ArtifactRecord",
    "ArtifactRef",
    "ComparisonRecord",
    "ExperimentRecord",
    "RunRecord",
    "RunStatus",
    "SnapshotRecord",
    "StepRunRecord",
    "StepStatus",
    "Store",
    "utc_now",
]
