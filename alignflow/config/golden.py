"""Golden values per side: how far a new run of a side may move from the golden run of the same side.

This is the question the frameworks' own CI asks of every configuration — not "do the two sides agree", but
"did this side's own curve, memory or speed move against its golden values?". Two default sets, from the
frameworks' test harnesses:

- `megatron` — Megatron-LM's functional tests (`tests/functional_tests/python_test_utils/test_regular_pipeline.py`,
  `CHECK_THRESHOLDS`, and `common.pipeline`): `lm loss`, `mtp_1 loss` and `num-zeros` deterministic (equal at
  every step; the approximate alternative is rtol 5 %), `iteration-time` within rtol 5 % at every step after
  dropping the first 3 and the last value, `mem-allocated-bytes` and `mem-max-allocated-bytes` within rtol 5 %
  (np.allclose with atol 0). A test checks what its `METRICS` lists, by default `lm loss` and `num-zeros`: so does
  this set (list the others in `golden.metrics`);
- `mindspeed` — MindSpeed-LLM's CI (`tests/test_tools/test_ci_st.py`, `TestMargin`, `WARM_UP = 5`): `lm loss`
  within 2 % relative and `grad norm` within 10 % at every step; time per iteration and throughput as the mean
  after 5 warm-up steps, at most 5 % slower or lower; allocated and max allocated memory at most 10 % higher
  (less time or memory never fails); every one of them by default.

An experiment picks a set and may change a metric's margin or the metrics checked:

```yaml
golden:
  defaults: mindspeed
  margins:
    step_time_ms: {rtol: 0.5, aggregate: mean, one_sided: true, warmup_steps: 5}
  metrics: [lm_loss, grad_norm, mem_max_allocated_mb]    # default: every metric the set names
```

Metric names are the logs' canonical columns (`lm_loss`, `mtp_1_loss`, `grad_norm`, `step_time_ms`,
`throughput_tflops`) and, for memory, per rank: `mem_allocated_mb`, `mem_max_allocated_mb` (megatron's
`report_memory` line; MindSpore's `Used peak memory usage (without fragments)` is its max allocated).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from alignflow.config.yamlsource import at_key
from alignflow.errors import did_you_mean

MarginSet = Literal["megatron", "mindspeed"]
MEMORY_METRICS = ("mem_allocated_mb", "mem_max_allocated_mb")


class Margin(BaseModel):
    """How one metric may differ from its golden values (|actual - golden| <= atol + rtol * |golden|)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deterministic: bool = Field(False, description="Equal at every step (at the printed resolution); rtol/atol "
                                "are then ignored.")
    rtol: float = Field(0.0, ge=0, description="Relative margin (0.05 = 5 %).")
    atol: float = Field(0.0, ge=0, description="Absolute margin, in the metric's unit.")
    aggregate: Literal["step", "mean"] = Field("step", description="step: every step within the margin; mean: the "
                                               "mean over the steps after the warm-up.")
    one_sided: Literal["higher", "lower"] | None = Field(
        None, description="Only a move this way fails (memory and time: higher; throughput: lower).")
    warmup_steps: int = Field(0, ge=0, description="First steps left out.")
    skip_last: bool = Field(False, description="Leave the last step out (megatron's iteration-time check).")
    source: str = Field("", description="Where the margin comes from.")

    @model_validator(mode="after")
    def _some_margin(self) -> Margin:
        if not self.deterministic and self.rtol == 0 and self.atol == 0:
            raise ValueError("a margin needs deterministic: true, or rtol / atol above 0")
        return self


_MEGATRON = "Megatron-LM tests/functional_tests/python_test_utils/test_regular_pipeline.py (CHECK_THRESHOLDS)"
_MINDSPEED = "MindSpeed-LLM tests/test_tools/test_ci_st.py (TestMargin, WARM_UP = 5)"

DEFAULT_MARGINS: dict[MarginSet, dict[str, Margin]] = {
    "megatron": {
        "lm_loss": Margin(deterministic=True, source=_MEGATRON),
        "mtp_1_loss": Margin(deterministic=True, source=_MEGATRON),
        "num_zeros": Margin(deterministic=True, source=_MEGATRON),
        "step_time_ms": Margin(rtol=0.05, warmup_steps=3, skip_last=True,
                               source=f"{_MEGATRON}; iteration-time drops the first 3 and the last value"),
        "mem_allocated_mb": Margin(rtol=0.05, source=_MEGATRON),
        "mem_max_allocated_mb": Margin(rtol=0.05, source=_MEGATRON),
    },
    "mindspeed": {
        "lm_loss": Margin(rtol=0.02, source=_MINDSPEED),
        "grad_norm": Margin(rtol=0.1, source=_MINDSPEED),
        "step_time_ms": Margin(rtol=0.05, aggregate="mean", one_sided="higher", warmup_steps=5, source=_MINDSPEED),
        "throughput_tflops": Margin(rtol=0.05, aggregate="mean", one_sided="lower", warmup_steps=5,
                                    source=_MINDSPEED),
        "mem_allocated_mb": Margin(rtol=0.1, one_sided="higher", source=_MINDSPEED),
        "mem_max_allocated_mb": Margin(rtol=0.1, one_sided="higher", source=_MINDSPEED),
    },
}


# What each set checks unless `golden.metrics` says otherwise: Megatron's `METRICS` default (test_regular_pipeline.py:
# `model_config["METRICS"] if "METRICS" in model_config else ["lm loss", "num-zeros"]`), every metric MindSpeed's.
DEFAULT_METRICS: dict[MarginSet, tuple[str, ...]] = {
    "megatron": ("lm_loss", "num_zeros"),
    "mindspeed": tuple(DEFAULT_MARGINS["mindspeed"]),
}


class GoldenConfig(BaseModel):
    """`golden:` of an experiment: the margins its goldens are checked with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: MarginSet = Field("megatron", description="The default margin set: megatron (its functional tests) "
                                "or mindspeed (MindSpeed-LLM's CI).")
    margins: dict[str, Margin] = Field(default_factory=dict, description="Per-metric margins replacing the set's.")
    metrics: list[str] | None = Field(None, description="Metrics checked; default: the set's (megatron: lm_loss and "
                                      "num_zeros, as its tests' METRICS default; mindspeed: all of its metrics), plus "
                                      "every metric given a margin here.")

    def resolved(self) -> dict[str, Margin]:
        """Every checked metric with its margin (a listed metric without one is an error)."""
        margins = {**DEFAULT_MARGINS[self.defaults], **self.margins}
        if self.metrics is None:
            chosen = [*DEFAULT_METRICS[self.defaults], *(m for m in self.margins
                                                          if m not in DEFAULT_METRICS[self.defaults])]
            return {m: margins[m] for m in chosen}
        for i, metric in enumerate(self.metrics):
            if metric not in margins:
                known = {m for margin_set in DEFAULT_MARGINS.values() for m in margin_set}
                hint = "" if metric in known else did_you_mean(metric, list(margins))  # a typo, not another set's
                raise at_key(("metrics", i), f"no margin for {metric!r}{hint}; give "
                             f"one in golden.margins (the {self.defaults} set has "
                             f"{', '.join(DEFAULT_MARGINS[self.defaults])})")
        return {m: margins[m] for m in self.metrics}

    def with_defaults(self, defaults: MarginSet) -> tuple[dict[str, Margin], list[str]]:
        """The margins under another default set (`golden check --defaults`), and the metrics of `golden.metrics`
        that set has no margin for: those are left out (the caller says so), not an error. The experiment chose
        them for its own set: demo-matrix checks `mtp_1_loss` with Megatron's margins, and MindSpeed-LLM's CI,
        which checks no MTP loss, has no margin for it (issue 47)."""
        if self.metrics is None:
            return self.model_copy(update={"defaults": defaults}).resolved(), []
        margins = {**DEFAULT_MARGINS[defaults], **self.margins}
        return ({m: margins[m] for m in self.metrics if m in margins},
                [m for m in self.metrics if m not in margins])

    @model_validator(mode="after")
    def _metrics_have_margins(self) -> GoldenConfig:
        self.resolved()
        return self
