"""Regression checks: a run of an experiment against that experiment's last passing run.

The nightly regression flow runs a set of experiments and asks, for each, whether anything got worse since the
last run that passed (docs/architecture.md#orchestration, issue 9). Two things count as a regression:

- the **verdict** turned to fail (or the run did not finish, so there is no verdict at all), and
- a criterion's **value moved past its drift**: the compared quantity (`|value|` for absolute criteria) grew by
  more than `max(relative * |baseline|, of_threshold * threshold)`. Both parts matter: the relative part alone
  would flag any change of a value that happens to be ~0 (bit-identical twins give ME = 0), the threshold part
  alone would hide a value that doubled far below its threshold. A value that shrank is an improvement.

A run that fails with no passing run to compare with is reported too (`no passing baseline`): a nightly that has
never passed must not look green. A run that ended `error` (its configuration or environment stopped it) is
reported as such, not as a verdict, and only passing runs are ever baselines.

The baseline is the last passing run of the **same configuration** (the config fingerprint the run recorded); when
the experiment has passed only under another one (the file was edited, or a copy kept its `name:`), that run is
the baseline and the check says so (`config_changed`, a note naming both fingerprints and files): runs of two
configurations are never silently compared as one.

Everything here is pure: `check_run` takes plain values, `check_against_last_pass` reads them from a store passed
in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PASS = "pass"


class DriftLimit(BaseModel):
    """How far a criterion's value may grow before the nightly calls it a regression."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    relative: float = Field(0.5, ge=0, description="Allowed growth as a fraction of the baseline value (0.5 = +50%).")
    of_threshold: float = Field(
        0.1, ge=0, description="Allowed growth as a fraction of the criterion's threshold (a floor for values ~0)."
    )

    def allowed(self, baseline: float, threshold: float) -> float:
        return max(self.relative * abs(baseline), self.of_threshold * abs(threshold))


class DriftPolicy(BaseModel):
    """The drift limit of every criterion, with overrides by `statistic(metric)` or by metric name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: DriftLimit = Field(default_factory=DriftLimit, description="Limit for criteria without an override.")
    overrides: dict[str, DriftLimit] = Field(
        default_factory=dict,
        description="Per-criterion limits keyed by `statistic(metric)` (e.g. `me(grad_norm)`) or by metric name.",
    )

    def limit_for(self, criterion: Mapping[str, Any]) -> DriftLimit:
        specific = f"{criterion.get('statistic')}({criterion.get('metric')})"
        return self.overrides.get(specific) or self.overrides.get(str(criterion.get("metric"))) or self.default


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What the check needs to know about one run (from the store)."""

    run_id: str
    experiment: str
    status: str
    verdict: str | None
    criteria: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None
    config_sha256: str | None = None
    experiment_file: str | None = None  # the file the run's experiment was read from


@dataclass(frozen=True, slots=True)
class CriterionChange:
    """One criterion of the new run next to the same criterion of the baseline."""

    key: str
    label: str
    threshold: float | None
    baseline: float | None
    value: float | None
    allowed: float | None
    passed_before: bool | None
    passed_now: bool | None
    regression: str | None  # why this criterion regressed; None when it did not

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.value is None:
            return None
        return self.value - self.baseline


@dataclass(frozen=True, slots=True)
class RegressionCheck:
    """The outcome for one experiment: the run, its baseline, every criterion, and why it regressed (if it did)."""

    experiment: str
    run_id: str | None
    baseline_run_id: str | None
    status: str
    verdict: str | None
    baseline_verdict: str | None
    changes: tuple[CriterionChange, ...] = ()
    reasons: tuple[str, ...] = field(default=())
    config_changed: bool = False
    notes: tuple[str, ...] = ()  # what the reader must know beside the verdict (a baseline of another configuration)

    @property
    def regressed(self) -> bool:
        return bool(self.reasons)


def criterion_key(criterion: Mapping[str, Any]) -> str:
    """Identity of a criterion across runs: what is measured, not the threshold it is held to."""
    key = f"{criterion.get('statistic')}({criterion.get('metric')})"
    if criterion.get("steps"):
        key += f"@steps={','.join(str(s) for s in criterion['steps'])}"
    if criterion.get("exclude_steps"):
        key += f"@excluding={','.join(str(s) for s in criterion['exclude_steps'])}"
    return key


def _quantity(criterion: Mapping[str, Any]) -> float | None:
    value = criterion.get("value")
    if value is None or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return abs(float(value)) if criterion.get("absolute", True) else float(value)


def compare_criteria(current: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]],
                     policy: DriftPolicy) -> tuple[CriterionChange, ...]:
    """Pair the criteria of two runs by `criterion_key` and judge each pair (criteria new in `current` too)."""
    before = {criterion_key(c): c for c in baseline}
    changes = []
    for crit in current:
        key = criterion_key(crit)
        old = before.get(key)
        now_q = _quantity(crit)
        old_q = None if old is None else _quantity(old)
        threshold = crit.get("threshold")
        allowed = None
        reason = None
        if old is not None:
            if old_q is not None and now_q is None:
                reason = "value no longer computed"
            elif old_q is not None and now_q is not None:
                allowed = policy.limit_for(crit).allowed(old_q, float(threshold or 0.0))
                if now_q - old_q > allowed:
                    reason = f"grew by {now_q - old_q:.3g} (allowed {allowed:.3g})"
            if reason is None and old.get("passed") and crit.get("passed") is False:
                reason = "criterion now fails"
        changes.append(CriterionChange(
            key=key, label=str(crit.get("label") or key), threshold=None if threshold is None else float(threshold),
            baseline=old_q, value=now_q, allowed=allowed,
            passed_before=None if old is None else bool(old.get("passed")),
            passed_now=None if crit.get("passed") is None else bool(crit.get("passed")), regression=reason))
    return tuple(changes)


def check_run(run: RunOutcome, baseline: RunOutcome | None, policy: DriftPolicy) -> RegressionCheck:
    """Judge one run against its baseline (None: the experiment has never passed)."""
    reasons: list[str] = []
    if run.status == "error":
        reasons.append("run error (configuration or environment; no alignment result)"
                       + (f": {run.error}" if run.error else ""))
    elif run.status != "completed":
        reasons.append(f"run {run.status}" + (f": {run.error}" if run.error else ""))
    elif run.verdict != PASS:
        reasons.append(f"verdict {run.verdict or 'none'}" + (
            f" (last passing run {baseline.run_id})" if baseline is not None else " (no passing baseline)"))
    changes: tuple[CriterionChange, ...] = ()
    if baseline is not None:
        changes = compare_criteria(run.criteria, baseline.criteria, policy)
        reasons += [f"{c.label}: {c.regression}" for c in changes if c.regression]
    else:
        changes = compare_criteria(run.criteria, (), policy)
    changed = baseline is not None and run.config_sha256 != baseline.config_sha256
    notes = (config_note(run, baseline),) if changed and baseline is not None else ()
    return RegressionCheck(
        experiment=run.experiment, run_id=run.run_id, baseline_run_id=None if baseline is None else baseline.run_id,
        status=run.status, verdict=run.verdict, baseline_verdict=None if baseline is None else baseline.verdict,
        changes=changes, reasons=tuple(reasons), config_changed=changed, notes=notes)


def config_note(run: RunOutcome, baseline: RunOutcome) -> str:
    """`baseline run X ran another configuration of demo: config 1a2b3c4d (experiments/demo.yaml), this run
    5e6f7a8b (/tmp/copy.yaml)`."""
    def which(o: RunOutcome) -> str:
        return f"{(o.config_sha256 or '?')[:8]}" + (f" ({o.experiment_file})" if o.experiment_file else "")

    return (f"baseline run {baseline.run_id} ran another configuration of {run.experiment}: config "
            f"{which(baseline)}, this run {which(run)}; its criteria values are not this configuration's")


def not_started(experiment: str, error: str) -> RegressionCheck:
    """An experiment of the nightly that could not even be recorded (bad file, unknown host): a regression."""
    return RegressionCheck(experiment=experiment, run_id=None, baseline_run_id=None, status="not started",
                           verdict=None, baseline_verdict=None, reasons=(f"not started: {error}",))


def outcome_from_store(store: Any, run_id: str) -> RunOutcome:
    run = store.get_run(run_id)
    comparison = store.comparison(run.id)
    return RunOutcome(run_id=run.id, experiment=run.experiment, status=str(run.status), verdict=run.verdict,
                      criteria=tuple(comparison.criteria) if comparison is not None else (), error=run.error,
                      config_sha256=run.config_sha256, experiment_file=run.experiment_file)


def check_against_last_pass(store: Any, run_id: str, policy: DriftPolicy) -> RegressionCheck:
    """Check a recorded run against the newest passing run of its experiment that started before it: of the same
    configuration when there is one, else of any (and the check says the configuration differs)."""
    run = outcome_from_store(store, run_id)
    last = store.last_passing_run(run.experiment, before=run.run_id, config_sha256=run.config_sha256) \
        or store.last_passing_run(run.experiment, before=run.run_id)
    baseline = None if last is None else outcome_from_store(store, last.id)
    return check_run(run, baseline, policy)
