"""Judge a reproduction against the original run: reproduced or diverged, with every difference and its cause.

Checkpoints, data and configs are compared byte for byte (sha256). A training log's bytes always differ between
two executions (timestamps, step times), so a differing log is also compared by what it *measured*: when every
logged metric except the bookkeeping columns (timings, throughput, sample counters:
`alignflow.logs.schema.BOOKKEEPING_COLUMNS`) is identical, the difference is reported as timing-only, not as a
divergence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from alignflow.compare.context import VOLATILE_SNAPSHOT_KEYS
from alignflow.logs.schema import BOOKKEEPING_COLUMNS
from alignflow.store import Store
from alignflow.store.records import StepRunRecord, input_refs

Verdict = Literal["reproduced", "diverged"]


class FingerprintDiff(BaseModel):
    """One recorded value that differs between the original and the reproduction, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    what: str
    step: str | None = None
    original: str | None
    reproduction: str | None
    note: str = Field("", serialization_alias="cause")  # what changed that explains the difference
    substantive: bool = True  # False when the bytes differ but nothing about the model does


class Reproduction(BaseModel):
    """The judgement of a reproduction: reproduced when nothing substantive differs; `model_dump(mode="json")` is
    `alignflow reproduce --json`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    original: str
    reproduction: str
    differences: tuple[FingerprintDiff, ...]

    @property
    def substantive(self) -> tuple[FingerprintDiff, ...]:
        return tuple(d for d in self.differences if d.substantive)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> Verdict:
        return "diverged" if self.substantive else "reproduced"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reproduced(self) -> bool:
        return self.verdict == "reproduced"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def headline(self) -> str:
        """`REPRODUCED ...` or `DIVERGED ...: first at step X (cause)`: the line `alignflow reproduce` opens with."""
        real = self.substantive
        other = len(self.differences) - len(real)
        if not real:
            tail = f"; {other} difference(s) that change nothing (listed below)" if other else ""
            return (f"REPRODUCED: run {self.reproduction} gives every checkpoint, input, logged metric and verdict "
                    f"of run {self.original}{tail}")
        first = real[0]
        where = f"at step {first.step}" if first.step else f"in {first.what}"
        return (f"DIVERGED: {len(real)} substantive difference(s) from run {self.original}; the first {where}: "
                f"{first.what}" + (f" ({first.note})" if first.note else ""))


def judge_reproduction(store: Store, original_id: str, reproduction_id: str) -> Reproduction:
    """The verdict of a reproduction with every difference and its cause (see `diff_runs`)."""
    return Reproduction(original=original_id, reproduction=reproduction_id,
                        differences=tuple(diff_runs(store, original_id, reproduction_id)))


@dataclass
class _Walk:
    """What the steps compared so far pass on to the steps after them."""

    benign: set[str] = field(default_factory=set)  # sha256 pairs of artifacts whose bytes differ without meaning
    changed_outputs: dict[str, str] = field(default_factory=dict)  # artifact name -> the step whose output it is


def diff_runs(store: Store, original_id: str, reproduction_id: str) -> list[FingerprintDiff]:
    """Every artifact sha256, input fingerprint, cache key and host snapshot field that differs, in pipeline order,
    each with its cause: a step whose inputs differ passes the difference on (the cause is upstream); a step with
    the same inputs and cache key whose outputs differ is not deterministic; a cache key that differs with the
    same inputs means the command, a config file or the code changed. Host snapshot differences are listed as
    context (what may explain a divergence) and decide nothing by themselves.

    A cache key is a hash of the step's command, config files, code version and input fingerprints, so when it
    differs the cause named is the part that is known to differ: inputs that differ (or differ in timings only:
    two executions of a training never log the same timestamps), else the recorded command, else "a config file,
    the environment or the code version" — never a list of what might have changed when the inputs explain it.
    """
    diffs: list[FingerprintDiff] = []
    a_steps = {s.step: s for s in store.steps(original_id)}
    b_steps = {s.step: s for s in store.steps(reproduction_id)}
    walk = _Walk()
    for step in _pipeline_order(set(a_steps) | set(b_steps)):
        sa, sb = a_steps.get(step), b_steps.get(step)
        if sa is None or sb is None:
            diffs.append(FingerprintDiff(what=f"{step}: step", original=sa.status if sa else None,
                                         reproduction=sb.status if sb else None,
                                         note="the step ran in one of the runs only", step=step))
        else:
            diffs += _step_diffs(store, step, sa, sb, walk)
    ca, cb = store.comparison(original_id), store.comparison(reproduction_id)
    if ca is not None and cb is not None and ca.verdict != cb.verdict:
        diffs.append(FingerprintDiff(what="compare: verdict", original=ca.verdict, reproduction=cb.verdict,
                                     note="the compared logs differ (above)" if walk.changed_outputs else "",
                                     step="compare"))
    return diffs + _snapshot_diffs(store, original_id, reproduction_id, diverged=any(d.substantive for d in diffs))


def _step_diffs(store: Store, step: str, sa: StepRunRecord, sb: StepRunRecord, walk: _Walk) -> list[FingerprintDiff]:
    """What differs of one step run in both runs: its inputs, its outputs, its cache key."""
    inputs, real_inputs, timing_inputs = _input_diffs(step, sa, sb, walk)
    recipe = _recipe_change(sa, sb) if sa.cache_key != sb.cache_key and not (real_inputs or timing_inputs) else None
    why = (f"its inputs differ ({', '.join(real_inputs)})" if real_inputs
           else f"its inputs differ in timings only ({', '.join(timing_inputs)})" if timing_inputs
           else recipe if recipe
           else "same inputs and recipe: the step is not deterministic")
    outputs = _output_diffs(store, step, sa, sb, walk, why)
    diffs = inputs + outputs
    if sa.cache_key != sb.cache_key:
        if real_inputs:
            cause, real = f"its inputs changed ({', '.join(real_inputs)})", False  # counted with the inputs
        elif timing_inputs:
            cause, real = (f"its inputs differ in timings only ({', '.join(timing_inputs)}): the logs' bytes, "
                           "not what they measured; its command, config and code are not known to differ"), False
        elif any(d.substantive for d in outputs):
            cause, real = str(recipe), True
        else:
            cause, real = f"{recipe}; the outputs did not", False
        diffs.append(FingerprintDiff(what=f"{step}: cache key (command, config, code, inputs)", original=sa.cache_key,
                                     reproduction=sb.cache_key, note=cause, substantive=real, step=step))
    return diffs


def _input_diffs(step: str, sa: StepRunRecord, sb: StepRunRecord, walk: _Walk
                 ) -> tuple[list[FingerprintDiff], list[str], list[str]]:
    """The inputs of `step` whose sha256 differs, each with its cause; and the names of those that differ in what
    they hold, and of those that differ in timings only (upstream logs)."""
    from alignflow.pipeline import producer

    ins_a = {k: ref.sha256 for k, ref in input_refs(sa.inputs).items()}
    ins_b = {k: ref.sha256 for k, ref in input_refs(sb.inputs).items()}
    real_inputs: list[str] = []
    timing_inputs: list[str] = []
    diffs: list[FingerprintDiff] = []
    for name in sorted(set(ins_a) | set(ins_b)):
        if ins_a.get(name) == ins_b.get(name):
            continue
        same = f"{ins_a.get(name)}:{ins_b.get(name)}" in walk.benign
        made_by = producer(name)
        if same:
            cause = "the upstream log differs in timings only"
        elif name in walk.changed_outputs:
            cause = f"output of step {walk.changed_outputs[name]}, which differs (above)"
        elif made_by is not None:
            cause = f"output of step {made_by.name}"
        else:
            cause = "a run input changed (not produced by a step)"
        (timing_inputs if same else real_inputs).append(name)
        diffs.append(FingerprintDiff(what=f"{step}: input {name} sha256", original=ins_a.get(name),
                                     reproduction=ins_b.get(name), note=cause, substantive=not same, step=step))
    return diffs, real_inputs, timing_inputs


def _output_diffs(store: Store, step: str, sa: StepRunRecord, sb: StepRunRecord, walk: _Walk,
                  why: str) -> list[FingerprintDiff]:
    """The outputs of `step` whose sha256 differs; `why` a substantive difference happened (its inputs, its recipe
    or chance). A log whose metrics are the same, and the report (it names its run), differ without meaning."""
    arts_a = {x.name: x for x in store.artifacts(sa.id)}
    arts_b = {x.name: x for x in store.artifacts(sb.id)}
    diffs: list[FingerprintDiff] = []
    for name in sorted(set(arts_a) | set(arts_b)):
        xa, xb = arts_a.get(name), arts_b.get(name)
        if xa is not None and xb is not None and xa.sha256 == xb.sha256:
            continue
        note, substantive = "", True
        if xa is not None and xb is not None and xa.kind == "log":
            note, substantive = _log_note(store, sa, sb)
        elif xa is not None and xb is not None and xa.kind == "report":
            note, substantive = "the report names its run; the verdicts are compared below", False
        if not substantive and xa is not None and xb is not None:
            walk.benign.add(f"{xa.sha256}:{xb.sha256}")
        if substantive:
            walk.changed_outputs[name] = step
            note = f"{note}; {why}" if note else why
        diffs.append(FingerprintDiff(what=f"{step}: {name} sha256", original=xa.sha256 if xa else None,
                                     reproduction=xb.sha256 if xb else None, note=note, substantive=substantive,
                                     step=step))
    return diffs


def _snapshot_diffs(store: Store, original_id: str, reproduction_id: str, *, diverged: bool
                    ) -> list[FingerprintDiff]:
    """Host snapshot fields that differ: context for a divergence, never one by themselves."""
    snaps_a = {s.host: s.data for s in store.snapshots(original_id)}
    snaps_b = {s.host: s.data for s in store.snapshots(reproduction_id)}
    diffs: list[FingerprintDiff] = []
    for host in sorted(set(snaps_a) | set(snaps_b)):
        flat_a, flat_b = _flatten(snaps_a.get(host, {})), _flatten(snaps_b.get(host, {}))
        for key in sorted(set(flat_a) | set(flat_b)):
            if key.endswith(VOLATILE_SNAPSHOT_KEYS) or flat_a.get(key) == flat_b.get(key):
                continue
            diffs.append(FingerprintDiff(
                what=f"{host}: snapshot {key}", original=flat_a.get(key), reproduction=flat_b.get(key),
                note="host environment changed: a candidate cause of the divergence" if diverged
                else "host environment changed; every output is the same", substantive=False))
    return diffs


def _recipe_change(sa: StepRunRecord, sb: StepRunRecord) -> str:
    """What differs of a step whose key changed with the same inputs: the recorded command when it differs (its
    first differing word), else what the key covers and the record does not keep."""
    if (sa.command or "") != (sb.command or ""):
        words_a, words_b = (sa.command or "").split(), (sb.command or "").split()
        first = next((i for i, (x, y) in enumerate(zip(words_a, words_b, strict=False)) if x != y),
                     min(len(words_a), len(words_b)))
        was = words_a[first] if first < len(words_a) else "(nothing)"
        now = words_b[first] if first < len(words_b) else "(nothing)"
        return f"the command changed ({_clip(was)} -> {_clip(now)})"
    return "a config file, the environment or the code version changed (the command and inputs are the same)"


def _clip(word: str, limit: int = 60) -> str:
    return word if len(word) <= limit else word[: limit - 1] + "…"


def _pipeline_order(steps: set[str]) -> list[str]:
    from alignflow.pipeline import STEP_NAMES

    return [s for s in STEP_NAMES if s in steps] + sorted(steps - set(STEP_NAMES))


def _origin(store: Store, step_run: StepRunRecord) -> StepRunRecord:
    """The step run that actually executed (a cached step points at it)."""
    return store.get_step(step_run.reused_from) if step_run.reused_from else step_run


def _log_note(store: Store, sa: StepRunRecord, sb: StepRunRecord) -> tuple[str, bool]:
    ma, mb = _metrics_of(store, _origin(store, sa)), _metrics_of(store, _origin(store, sb))
    if ma is None or mb is None:
        return "log bytes differ; no recorded metrics to compare", True
    if ma == mb:
        return "timing only: every logged metric is identical (timestamps and step times differ)", False
    changed = sorted({k[0] for k in set(ma) ^ set(mb)} | {k[0] for k in set(ma) & set(mb) if ma[k] != mb[k]})
    return f"logged metrics differ: {', '.join(changed)}", True


def _metrics_of(store: Store, step_run: StepRunRecord) -> dict[tuple[str, int], float] | None:
    frame = store.metrics(step_run.run_id)
    rows = frame[frame["step_run_id"] == step_run.id]
    if rows.empty:
        return None
    return {(str(r.metric), int(r.step)): float(r.value) for r in rows.itertuples()
            if str(r.metric) not in BOOKKEEPING_COLUMNS and r.value == r.value}


def _flatten(data: object, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, list):
        out[prefix] = ",".join(str(x) for x in data)
    else:
        out[prefix] = str(data)
    return out
