"""The one view of a recorded run: `run_view(store, run_id) -> RunView`, shown by `alignflow show RUN` and printed
as JSON by `show --json`, `run --json` and `rerun --json` (one schema, `schema_version` in every document).

Frozen values read from the store in one place: status, error, trigger, parent, the steps in pipeline order with
their artifacts, the criteria of the comparison as they were judged (value and threshold already in the report's
notation, the steps that drive a failed one), the report. Core and Prefect-free; the CLI prints it, the flow and
the compare step read it (`report_context` turns it into what the HTML report shows of the run).

Schema history: 1 — first version (issue 20); `reasons` and each step's `reused_from_run` added (issue 19);
`config_sha256` and `experiment_file` added (issue 40).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    computed_field,
)

from alignflow import pipeline
from alignflow.compare.context import FingerprintRow, ReportContext, StepRow, TimingConditions
from alignflow.store import Store
from alignflow.store.records import StepRunRecord, input_refs

SCHEMA_VERSION: Final = 1
NOT_SELECTED = "not selected for this run"
"""The reason recorded for a step a run skips because its plan leaves it out (`--only`, a `diagnose` run)."""


# ISO 8601 as Python writes it (`+00:00`, not pydantic's `Z`): the notation every `show --json` document has used
Time = Annotated[datetime, PlainSerializer(datetime.isoformat, when_used="json")]


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArtifactView(_View):
    name: str
    host: str
    path: str
    kind: str
    sha256: str
    size_bytes: int


class StepView(_View):
    step: str
    step_run_id: str
    status: str
    host: str | None
    exit_code: int | None
    started: Time | None
    finished: Time | None
    duration_s: float | None
    cache_key: str | None
    reused_from: str | None  # the step run whose outputs a cached step took
    reused_from_run: str | None = None  # the run that step run belongs to
    error: str | None
    inputs: dict[str, JsonValue] = Field(exclude=True)  # as recorded (`start_step`): not part of `show --json`
    artifacts: tuple[ArtifactView, ...]


class CriterionView(_View):
    """One criterion as the comparison judged it, in the report's notation."""

    label: str
    value: float | None
    value_text: str
    threshold_text: str
    passed: bool
    first_outside: int | None
    driving_steps: tuple[int, ...]
    note: str
    source: str


class RunView(_View):
    """A recorded run, everything `alignflow show` prints; `model_dump(mode="json")` is `show --json`."""

    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    experiment: str
    status: str
    verdict: str | None
    trigger: str
    parent_id: str | None
    code_version: str
    started: Time
    finished: Time | None
    duration_s: float | None
    error: str | None
    report: str | None
    steps: tuple[StepView, ...]
    criteria: tuple[CriterionView, ...]
    reasons: tuple[str, ...] = ()  # why the verdict is fail: each failed criterion with its driving steps, ...
    # host -> its snapshot as recorded (a `HostSnapshot` as JSON); `show --json` lists the hosts only
    snapshots: dict[str, dict[str, JsonValue]] = Field(exclude=True)
    config_sha256: str | None = None  # the experiment's configuration this run ran (its fingerprint)
    experiment_file: str | None = None  # the file that configuration was read from
    # the switch matrix of a run with `variants:` (verdict, report) and each variant (name, group, verdict, outcome,
    # expect, status): in the documents of matrix runs only
    matrix: Mapping[str, Any] | None = Field(None, exclude_if=lambda v: v is None)
    variants: tuple[Mapping[str, Any], ...] = Field((), exclude_if=lambda v: not v)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def hosts(self) -> list[str]:
        """The hosts the run recorded a snapshot of."""
        return sorted(self.snapshots)

    def step(self, name: str) -> StepView | None:
        """The last recorded attempt at step `name`."""
        found = [s for s in self.steps if s.step == name]
        return found[-1] if found else None

    @property
    def not_run(self) -> tuple[str, ...]:
        """The steps this run left out because they were not selected (`--only`, a `diagnose` run), in pipeline
        order: what a partial run did not do."""
        return tuple(s.step for s in self.steps if s.status == "skipped" and s.error == NOT_SELECTED)

    @property
    def exit_code(self) -> int:
        """What the run commands exit with: 0 completed with verdict pass, or a partial run whose selected steps
        completed (no comparison in its plan, so no verdict); 1 a failed alignment (verdict fail) or a failed
        step; 2 a configuration or environment error (status `error`: nothing about the alignment was learned)."""
        if self.status == "completed":
            return 0 if self.verdict in ("pass", None) else 1
        return 2 if self.status == "error" else 1

    @property
    def report_run(self) -> str | None:
        """The run whose comparison wrote `report`: this run, or the one a cached `compare` was reused from."""
        if self.report is None:
            return None
        compare = self.step("compare")
        return compare.reused_from_run if compare is not None and compare.reused_from_run else self.run_id


def run_view(store: Store, run_id: str) -> RunView:
    """The view of run `run_id` (a unique prefix is enough), read from `store`."""
    run = store.get_run(run_id)
    records = store.steps(run.id)
    order = _pipeline_order()
    ranked = sorted(enumerate(records), key=lambda ir: (order.get(ir[1].step, len(order)), ir[0]))
    steps = tuple(StepView(
        step=s.step, step_run_id=s.id, status=str(s.status), host=s.host, exit_code=s.exit_code, started=s.started_at,
        finished=s.finished_at, duration_s=s.duration_s, cache_key=s.cache_key, reused_from=s.reused_from,
        error=s.error, inputs=dict(s.inputs or {}),
        artifacts=tuple(ArtifactView(name=a.name, host=a.host, path=a.path, kind=a.kind, sha256=a.sha256,
                                     size_bytes=a.size_bytes) for a in store.artifacts(s.id)),
        reused_from_run=store.get_step(s.reused_from).run_id if s.reused_from else None,
    ) for _, s in ranked)
    comparison = store.comparison(run.id)
    criteria = tuple(criterion_view(c) for c in (comparison.criteria if comparison is not None else []))
    matrix = store.matrix(run.id)
    return RunView(
        run_id=run.id, experiment=run.experiment, status=str(run.status), verdict=run.verdict, trigger=run.trigger,
        parent_id=run.parent_id, code_version=run.code_version, started=run.started_at, finished=run.finished_at,
        duration_s=run.duration_s, error=run.error, report=run.report, steps=steps, criteria=criteria,
        snapshots={s.host: dict(s.data) for s in store.snapshots(run.id)},
        reasons=tuple(str(r) for r in (comparison.summary or {}).get("reasons") or ()) if comparison else (),
        config_sha256=run.config_sha256, experiment_file=run.experiment_file,
        matrix=None if matrix is None else {"verdict": matrix.verdict, "report": matrix.report,
                                            "reasons": list(matrix.summary.get("reasons") or [])},
        variants=tuple({k: v.get(k) for k in ("name", "group", "verdict", "outcome", "expect", "as_expected",
                                              "status", "exit_code", "run_id")}
                       for v in (matrix.summary.get("variants") or [] if matrix is not None else [])),
    )


def criterion_view(doc: Mapping[str, Any]) -> CriterionView:
    """A recorded criterion result (`CriterionResult.to_json()`); records written before issue 20 lack the text
    fields, which are then derived from the value and the statistic."""
    from alignflow.compare.formatting import fmt_stat
    from alignflow.config.statistics import is_relative

    statistic = str(doc.get("statistic", ""))
    value = doc.get("value")
    threshold = doc.get("threshold")
    threshold_text = doc.get("threshold_text") or (
        "" if threshold is None else f"{threshold * 100:g}%" if is_relative(statistic) else f"{threshold:g}")
    return CriterionView(
        label=str(doc.get("label") or f"{statistic}({doc.get('metric', '?')})"), value=value,
        value_text=str(doc.get("value_text") or fmt_stat(value, statistic, None)), threshold_text=threshold_text,
        passed=bool(doc.get("passed")), first_outside=doc.get("first_outside"),
        driving_steps=tuple(int(d["step"]) for d in doc.get("drivers") or []), note=str(doc.get("note") or ""),
        source=str(doc.get("source") or ""))


DEFAULT_SIDES = {s.label: s.training for s in pipeline.SIDES}
"""Report label -> the step whose host is that side (its compared training)."""


def report_context(view: RunView, *, sides: Mapping[str, str] | None = None, description: str | None = None,
                   writing: str | None = None, generated_at: datetime | None = None,
                   timing: Mapping[str, TimingConditions] | None = None) -> ReportContext:
    """What the HTML report shows of the run: its steps, every artifact's and input's fingerprint, and the host
    snapshots of the sides. `sides`: report label -> the step whose host is that side (default NPU ->
    npu_reload_train, GPU -> gpu_train).

    `writing`: the step that writes this report (compare), still open in the store while it does; the report is
    its output, so a reader of the report reads a finished step: shown `ran`, timed up to `generated_at` (issue 40:
    every report showed `compare` as `running`). `timing`: how each side's step times were taken
    (`timing_conditions`)."""
    sides = sides or DEFAULT_SIDES
    rows = tuple(_step_row(s, writing, generated_at) for s in view.steps)
    prints: list[FingerprintRow] = []
    seen: set[tuple[str, str]] = set()
    produced = {a.name for s in view.steps for a in s.artifacts}
    for s in view.steps:
        for name, ref in input_refs(s.inputs).items():  # run inputs (the data file): no step of the run made them
            if name not in produced and (name, ref.sha256) not in seen:
                seen.add((name, ref.sha256))
                prints.append(FingerprintRow(name, ref.sha256, ref.size, f"{ref.host}:{ref.path}"))
        for a in s.artifacts:
            if (a.name, a.sha256) not in seen:
                seen.add((a.name, a.sha256))
                prints.append(FingerprintRow(a.name, a.sha256, a.size_bytes, f"{a.host}:{a.path}", s.step))
    snapshots: dict[str, Mapping[str, Any]] = {}
    for label, step in sides.items():
        sv = view.step(step)
        if sv is not None and sv.host is not None and sv.host in view.snapshots:
            snapshots[label] = view.snapshots[sv.host]
    return ReportContext(run_id=view.run_id, experiment=view.experiment, description=description,
                         generated_at=generated_at, steps=rows, fingerprints=tuple(prints), snapshots=snapshots,
                         timing=dict(timing or {}))


def _step_row(s: StepView, writing: str | None, generated_at: datetime | None) -> StepRow:
    note = s.error or (f"outputs of step run {s.reused_from}" if s.reused_from else "")
    if s.step == writing and s.status in ("pending", "running"):
        took = (generated_at - s.started).total_seconds() if generated_at and s.started else None
        return StepRow(s.step, "ran", s.host, took, 0, "wrote this report")
    return StepRow(s.step, s.status, s.host, s.duration_s, s.exit_code, note)


def timing_conditions(store: Store, view: RunView, sides: Mapping[str, str] | None = None
                      ) -> dict[str, TimingConditions]:
    """label -> how that side's training was timed: on which device and machine, in which run (a cached training
    was timed in the run it was reused from), beside which steps on the same machine, under what load."""
    out: dict[str, TimingConditions] = {}
    for label, step in (sides or DEFAULT_SIDES).items():
        sv = view.step(step)
        if sv is None or sv.status not in ("ran", "cached"):
            continue
        out[label] = step_timing(store, store.get_step(sv.step_run_id), view.run_id)
    return out


def step_timing(store: Store, record: StepRunRecord, run_id: str) -> TimingConditions:
    """How the step run `record` of run `run_id` was timed (a cached one: the step run it was reused from)."""
    origin = record
    for _ in range(100):  # a cached step points at the step run that executed (or at another cached one)
        if origin.reused_from is None:
            break
        origin = store.get_step(origin.reused_from)
    snaps = {snap.host: snap.data for snap in store.snapshots(origin.run_id)}
    mine = snaps.get(origin.host or "", {})
    machine = mine.get("hostname") or origin.host
    others = [o for o in store.steps(origin.run_id)
              if o.id != origin.id and o.reused_from is None and o.host is not None
              and (snaps.get(o.host, {}).get("hostname") or o.host) == machine and _overlap(origin, o)]
    load = mine.get("load") or [None]
    return TimingConditions(
        device=host_device(mine) if mine else None, machine=machine, measured_in=origin.run_id,
        cached=origin.run_id != run_id, beside=tuple(sorted({o.step for o in others})),
        shared=_shared(origin, others), load_1m=load[0], cpus=mine.get("cpus"))


def _overlap(a: StepRunRecord, b: StepRunRecord) -> bool:
    """Two step runs were executing at the same moment (an unfinished one counts as running on)."""
    if a.started_at is None or b.started_at is None:
        return False
    return (b.finished_at is None or a.started_at < b.finished_at) and (
        a.finished_at is None or b.started_at < a.finished_at)


def _shared(step: StepRunRecord, others: list[StepRunRecord]) -> float | None:
    """The share of `step`'s wall time during which at least one of `others` was executing (None: not timed)."""
    if step.started_at is None or step.finished_at is None or step.finished_at <= step.started_at:
        return None
    start, end = step.started_at, step.finished_at
    spans = sorted((max(o.started_at, start), min(o.finished_at or end, end)) for o in others if o.started_at)
    covered, reach = 0.0, start
    for a, b in spans:
        a = max(a, reach)
        if b > a:
            covered += (b - a).total_seconds()
            reach = b
    return covered / (end - start).total_seconds()


def host_device(snapshot: Mapping[str, Any]) -> str:
    """What the host's own tools report: `NVIDIA H100 80GB HBM3 x8`, `Ascend NPU (npu-smi)`, or CPU only."""
    acc = snapshot.get("accelerators") or {}
    nvidia = acc.get("nvidia-smi") or {}
    names = [line.split(",")[1].strip() for line in (nvidia.get("output") or "").splitlines() if line.count(",") >= 1]
    if names:
        counted = {n: names.count(n) for n in names}
        return ", ".join(f"{n} x{k}" for n, k in counted.items())
    if (acc.get("npu-smi") or {}).get("present"):
        return "Ascend NPU (npu-smi)"
    return "CPU (no npu-smi, no nvidia-smi on the host)"


def _pipeline_order() -> dict[str, int]:
    return {name: i for i, name in enumerate(pipeline.STEP_NAMES)}
