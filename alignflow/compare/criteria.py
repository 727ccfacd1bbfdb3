"""Acceptance criteria as data: which statistic of which metric must stay under which threshold.

The defaults are the seeds' own: `|me(lm_loss)| < 0.001` and `|me(grad_norm)| < 0.01` (seed 000, GLM-5.2);
`step_rel(lm_loss, step 1) < 0.5%` and `mean_rel(lm_loss, excluding step 2) < 1%` (seed 001, Qwen3.5 — step 2
is the Adam first-step transient of §10.7); `mean_rel(lm_loss) < 2%` (seed 004, cross-backend).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Statistic = Literal["me", "mean_abs", "max_error", "min_error", "max_abs", "step_rel", "mean_rel", "max_rel"]
RELATIVE_STATISTICS = frozenset({"step_rel", "mean_rel", "max_rel"})  # |t-r|/(|r|+1e-8): shown as percentages
STATISTICS: tuple[str, ...] = ("me", "mean_abs", "max_error", "min_error", "max_abs", "step_rel", "mean_rel", "max_rel")


class Criterion(BaseModel):
    """One acceptance rule: `[abs](statistic(metric)) < threshold`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(description="Canonical metric name: lm_loss, grad_norm, mtp_1_loss, load_balancing_loss, lr.")
    statistic: Statistic = Field(description="Statistic of the per-step error test - reference.")
    threshold: float = Field(
        gt=0, description="Upper bound. Relative statistics take a fraction (0.005) or a percent string ('0.5%')."
    )
    absolute: bool = Field(True, description="Compare |value| with the threshold (the seeds' abs(ME) < t).")
    inclusive: bool = Field(False, description="Pass on value == threshold (`<=` instead of `<`).")
    steps: list[int] | None = Field(None, description="Steps evaluated by step_rel (default [1]).")
    exclude_steps: list[int] = Field(default_factory=list, description="Steps left out of the statistic.")
    source: str | None = Field(None, description="Where the rule comes from (e.g. 'seed 000 §1').")

    @field_validator("threshold", mode="before")
    @classmethod
    def _percent(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                return float(value.strip()[:-1]) / 100.0
            except ValueError:
                raise ValueError(f"threshold {value!r} is not a number or percentage") from None
        return value

    @model_validator(mode="after")
    def _steps_only_for_step_rel(self) -> Criterion:
        if self.steps is not None and self.statistic != "step_rel":
            raise ValueError("steps applies to statistic step_rel only; use exclude_steps to leave steps out")
        return self

    @property
    def label(self) -> str:
        inner = f"{self.statistic}({self.metric}"
        if self.statistic == "step_rel":
            inner += f", step {','.join(str(s) for s in (self.steps or [1]))}"
        if self.exclude_steps:
            inner += f", excluding step {','.join(str(s) for s in self.exclude_steps)}"
        inner += ")"
        op = "<=" if self.inclusive else "<"
        return f"{'|' + inner + '|' if self.absolute else inner} {op} {self.threshold:g}"


def default_criteria() -> list[Criterion]:
    """The seeds' acceptance criteria (seed 000 §1, seed 001 overview, seed 004 appendix)."""
    return [
        Criterion(metric="lm_loss", statistic="me", threshold=0.001, source="seed 000 §1"),
        Criterion(metric="grad_norm", statistic="me", threshold=0.01, source="seed 000 §1"),
        Criterion(metric="lm_loss", statistic="step_rel", threshold=0.005, steps=[1], source="seed 001 overview"),
        Criterion(metric="lm_loss", statistic="mean_rel", threshold=0.01, exclude_steps=[2],
                  source="seed 001 overview, §10.7"),
        Criterion(metric="lm_loss", statistic="mean_rel", threshold=0.02, source="seed 004 appendix (cross-backend)"),
    ]
