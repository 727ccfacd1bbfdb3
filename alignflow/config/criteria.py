"""Acceptance criteria as data: which statistic of which metric must stay under which threshold.

The defaults are the seeds' own: `|me(lm_loss)| < 0.001` and `|me(grad_norm)| < 0.01` (seed 000, GLM-5.2);
`step_rel(lm_loss, step 1) < 0.5%` (at the first step both logs print when one did not print step 1) and
`mean_rel(lm_loss, excluding step 2) < 1%` (seed 001, Qwen3.5 — step 2 is the Adam first-step transient of
docs/seeds.md#step-2-outlier-after-the-first-adam-update); `mean_rel(lm_loss) < 2%` (seed 004, cross-backend).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

from alignflow.config.statistics import STATISTICS, statistic
from alignflow.config.yamlsource import load_yaml, validate

_NOISE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*x\s*noise\s*$", re.IGNORECASE)


class Criterion(BaseModel):
    """One acceptance rule: `[abs](statistic(metric)) < threshold`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(description="Canonical metric name: lm_loss, grad_norm, mtp_1_loss, load_balancing_loss, lr.")
    statistic: str = Field(description="Statistic of the per-step error test - reference: a registered one's name "
                           "(alignflow.config.statistics).")
    threshold: float = Field(
        description="Upper bound (> 0). Relative statistics take a fraction (0.005) or a percent string ('0.5%'); "
        "'3x noise' is 3 times the statistic's measured self-noise (`alignflow noise`), unmeasured = fails."
    )
    noise_multiple: float | None = Field(None, gt=0, description="Set by a 'Nx noise' threshold: N.")
    absolute: bool = Field(True, description="Compare |value| with the threshold (the seeds' abs(ME) < t).")
    inclusive: bool = Field(False, description="Pass on value == threshold (`<=` instead of `<`).")
    steps: list[int] | None = Field(
        None, description="Steps evaluated by step_rel (default: the first step both logs print, step 1 when both "
        "print it). A listed step that neither log printed is not evaluated (no failure); one printed by only one "
        "log fails.")
    exclude_steps: list[int] = Field(default_factory=list, description="Steps left out of the statistic.")
    source: str | None = Field(None, description="Where the rule comes from "
                               "(e.g. 'docs/seeds.md#glm-52-criteria-mean-error').")

    @model_validator(mode="before")
    @classmethod
    def _noise(cls, data: Any) -> Any:
        """`threshold: "3x noise"` -> noise_multiple 3, threshold NaN until a noise floor resolves it (a NaN
        threshold fails every comparison: an unmeasured noise floor never passes)."""
        if isinstance(data, dict) and isinstance(data.get("threshold"), str):
            match = _NOISE.match(data["threshold"])
            if match:
                return {**data, "threshold": math.nan, "noise_multiple": float(match.group(1))}
        return data

    @field_validator("threshold", mode="before")
    @classmethod
    def _percent(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                return float(value.strip()[:-1]) / 100.0
            except ValueError:
                raise ValueError(f"threshold {value!r} is not a number or percentage") from None
        return value

    @field_serializer("threshold")
    def _keep_noise(self, value: float) -> float | str:
        """An unresolved 'Nx noise' stays that string in JSON (NaN is not JSON, and it reloads as written)."""
        return f"{self.noise_multiple:g}x noise" if self.noise_multiple is not None and math.isnan(value) else value

    @model_validator(mode="after")
    def _positive(self) -> Criterion:
        if self.noise_multiple is None and not self.threshold > 0:
            raise ValueError("threshold must be > 0 (or 'Nx noise')")
        return self

    @field_validator("statistic")
    @classmethod
    def _registered(cls, value: str) -> str:
        return statistic(value).name

    @property
    def at_steps(self) -> bool:
        """Judged at chosen steps (`steps`), not over the run."""
        return STATISTICS[self.statistic].reduce == "at_steps"

    @model_validator(mode="after")
    def _steps_only_for_step_rel(self) -> Criterion:
        if self.steps is not None and not self.at_steps:
            at = ", ".join(s.name for s in STATISTICS.values() if s.reduce == "at_steps")
            raise ValueError(f"steps applies to statistic {at} only; use exclude_steps to leave steps out")
        return self

    @property
    def label(self) -> str:
        inner = f"{self.statistic}({self.metric}"
        if self.at_steps:
            # unset steps: step 1, or the first step both logs print when neither printed it (the result says so)
            inner += f", step {','.join(str(s) for s in (self.steps or [1]))}"
        if self.exclude_steps:
            inner += f", excluding step {','.join(str(s) for s in self.exclude_steps)}"
        inner += ")"
        op = "<=" if self.inclusive else "<"
        bound = f"{self.threshold:g}"
        if self.noise_multiple is not None:
            bound = (f"{self.noise_multiple:g}x noise" + ("" if math.isnan(self.threshold) else f" = {bound}")
                     + (" (noise not measured)" if math.isnan(self.threshold) else ""))
        return f"{'|' + inner + '|' if self.absolute else inner} {op} {bound}"


def default_criteria() -> list[Criterion]:
    """The seeds' acceptance criteria (docs/seeds.md#glm-52-criteria-mean-error,
    docs/seeds.md#qwen35-criteria-relative-error, docs/seeds.md#cross-backend-fsdp2-criterion)."""
    return [
        Criterion(metric="lm_loss", statistic="me", threshold=0.001,
                  source="docs/seeds.md#glm-52-criteria-mean-error"),
        Criterion(metric="grad_norm", statistic="me", threshold=0.01,
                  source="docs/seeds.md#glm-52-criteria-mean-error"),
        # step 1 when both logs print it, else the first step they both print (the result says which)
        Criterion(metric="lm_loss", statistic="step_rel", threshold=0.005,
                  source="docs/seeds.md#qwen35-criteria-relative-error"),
        Criterion(metric="lm_loss", statistic="mean_rel", threshold=0.01, exclude_steps=[2],
                  source="docs/seeds.md#qwen35-criteria-relative-error, "
                         "docs/seeds.md#step-2-outlier-after-the-first-adam-update"),
        Criterion(metric="lm_loss", statistic="mean_rel", threshold=0.02,
                  source="docs/seeds.md#cross-backend-fsdp2-criterion (cross-backend)"),
    ]


class CriteriaFile(BaseModel):
    """A criteria file (`alignflow compare --criteria FILE`, an experiment's `criteria: FILE`)."""

    model_config = ConfigDict(extra="forbid")
    description: str = Field("", description="What these criteria are for.")
    criteria: list[Criterion] = Field(description="Acceptance criteria.")


def load_criteria(path: str | Path) -> list[Criterion]:
    """Load a criteria file: `criteria: [{metric, statistic, threshold, ...}, ...]` (file:line errors)."""
    return list(validate(CriteriaFile, load_yaml(path)).criteria)
