"""A switch matrix in an experiment (`variants:`): a reference configuration and named variants of it, each a patch
of the experiment, optionally in groups with their own steps and performance windows.

Seed 004's method (docs/seeds.md#switch-matrix): a reference configuration B and variants that each change one
switch (or several), all trained from the same weights on the same data, each compared with B; groups (F200, F500,
P32K) with their own number of steps and performance window, compared only within the group.

```yaml
variants:
  reference: 00_baseline              # the experiment as written (in each group, with the group's patch)
  warmup_steps: 3                     # performance window: the steps after these (default 10, as `compare`)
  criteria: [...]                     # OFF vs ON on one side; default: the experiment's criteria
  groups:                             # optional: each with its own steps, window and patch
    F200: {steps: 200, warmup_steps: 100}
    F500: {steps: 500, warmup_steps: 100}
  configs:
    01_recompute:
      switch: Recompute off→on        # the row's label, as the seed writes it
      patch: {training: {recompute: full}}
    03_no_fusion:
      switch: SwiGLU fusion off→on
      direction: on_off               # this config is the OFF side, the reference the ON side (seed's 03→00)
      patch: {training: {bias_swiglu_fusion: false}}
    07_bf16:
      expect: fail                    # numerics change on purpose: the matrix passes when this one is flagged
      patch: {training: {bf16: true}}
  pairs:                              # extra rows between two configs of a group (seed 004's 04→05)
    - {switch: Fusion static→dynamic, configs: [04_a, 05_b]}      # [OFF, ON]
```

A patch merges into the experiment mapping by mapping (a list or scalar replaces the value): any key of the
experiment except `name` and `variants` — model, training, `training.parallel`, `npu.overrides` (a MindFormers
template value), `gpu.extra_args`, a side's `env`, ... Every patched experiment is validated when the file is
loaded; a bad key is reported at the line where the patch writes it (`file:line: variants.configs.X.patch.key:
...`). The trainings of a variant start from the reference's converted weights (the seed's "same DCP path"): its
base training and conversions are the reference's, whatever the patch says.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alignflow.config.criteria import Criterion
from alignflow.config.yamlsource import at_key
from alignflow.errors import did_you_mean

DEFAULT_GROUP = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
_FORBIDDEN_PATCH_KEYS = frozenset({"name", "variants"})


def _check_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r}: use letters, digits and _ . + - (64 at most, no '/'): it names runs, "
                         "records and files")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VariantGroup(_Strict):
    """A group of the matrix (seed 004's F200 / F500 / P32K): its own reference run, steps and performance window."""

    steps: int | None = Field(None, ge=1, description="Training steps of the group's trainings (training.steps); "
                              "default: the experiment's.")
    warmup_steps: int | None = Field(None, ge=0, description="Steps left out of the group's ms/iter, samples/s and "
                                     "P95/P99 (seed 004: 100 of 200, 10 of 40); default: the matrix's.")
    patch: dict[str, Any] = Field(default_factory=dict, description="Patch of the experiment for every training of "
                                  "the group, the reference's included (e.g. a longer sequence, another micro batch).")
    description: str = Field("", description="What the group measures.")


class VariantConfig(_Strict):
    """One variant: a patch of the reference and how its row reads."""

    patch: dict[str, Any] = Field(description="What this variant changes, as a patch of the experiment.")
    switch: str | None = Field(None, description="The row's label (`Recompute off→on`); default: the config's name.")
    direction: Literal["off_on", "on_off"] = Field(
        "off_on", description="off_on: the reference is OFF and this config ON (reference → config); on_off: this "
        "config is OFF and the reference ON (config → reference, seed 004's `EP1→8 03→00`). Errors are taken with "
        "the OFF side as the reference, as the seed's tables are.")
    groups: list[str] | None = Field(None, description="Groups this config runs in; default: every group.")
    expect: Literal["pass", "fail", "oom"] = Field(
        "pass", description="What the variant is expected to show: pass (numerics unchanged), fail (numerics change "
        "on purpose, e.g. bf16 write-back) or oom (runs out of memory, a capacity probe). The matrix passes when "
        "every variant shows what it was expected to.")
    description: str = Field("", description="What the switch does.")


class VariantPair(_Strict):
    """An extra row comparing two configs of a group (neither need be the reference). `configs: [OFF, ON]` (YAML
    reads bare `off:` / `on:` keys as booleans, so the pair is a list)."""

    configs: tuple[str, str] = Field(description="[OFF, ON]: the OFF config is the comparison's reference.")
    switch: str | None = Field(None, description="The row's label; default `OFF → ON`.")
    groups: list[str] | None = Field(None, description="Groups it is compared in; default: every group holding both.")

    @property
    def off(self) -> str:
        return self.configs[0]

    @property
    def on(self) -> str:
        return self.configs[1]


class Matrix(_Strict):
    """`variants:` of an experiment."""

    reference: str = Field("reference", description="Name of the reference configuration (the experiment as "
                           "written, with each group's patch).")
    configs: dict[str, VariantConfig] = Field(description="The variants by name; names order the report's rows "
                                              "(prefix them 01_, 02_, ... as seed 004 does).")
    groups: dict[str, VariantGroup] = Field(default_factory=dict, description="Groups with their own steps and "
                                            "performance window; none: one group, the experiment as written.")
    pairs: list[VariantPair] = Field(default_factory=list, description="Extra rows between two configs.")
    criteria: list[Criterion] | None = Field(None, description="Criteria of each OFF/ON comparison (one side against "
                                             "itself); default: the experiment's.")
    warmup_steps: int = Field(10, ge=0, description="Steps left out of the performance figures (per group: "
                              "groups.<name>.warmup_steps).")

    @field_validator("reference")
    @classmethod
    def _reference_name(cls, value: str) -> str:
        return _check_name(value, "reference")

    @field_validator("configs")
    @classmethod
    def _config_names(cls, value: dict[str, VariantConfig]) -> dict[str, VariantConfig]:
        if not value:
            raise ValueError("at least one config")
        for name in value:
            _check_name(name, "config")
        return value

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: dict[str, VariantGroup]) -> dict[str, VariantGroup]:
        for name in value:
            _check_name(name, "group")
        return value

    @model_validator(mode="after")
    def _references(self) -> Matrix:
        """Every name the matrix refers to exists; a wrong one is located at the key that writes it."""
        if self.reference in self.configs:
            raise at_key(("configs", self.reference), f"{self.reference!r} is the reference's name")
        groups = list(self.groups)
        declared = f"groups are: {', '.join(groups) or 'none declared'}"
        for name, config in self.configs.items():
            for i, group in enumerate(config.groups or ()):
                if group not in self.groups:
                    raise at_key(("configs", name, "groups", i),
                                 f"unknown group {group!r}{did_you_mean(group, groups)}; {declared}")
            for key in _FORBIDDEN_PATCH_KEYS & set(config.patch):
                raise at_key(("configs", name, "patch", key), f"a variant cannot change the experiment's {key}")
        for name, group_ in self.groups.items():
            for key in _FORBIDDEN_PATCH_KEYS & set(group_.patch):
                raise at_key(("groups", name, "patch", key), f"a group cannot change the experiment's {key}")
        known = [self.reference, *self.configs]
        for i, pair in enumerate(self.pairs):
            for j, side in enumerate(pair.configs):
                if side not in known:
                    raise at_key(("pairs", i, "configs", j), f"unknown config {side!r}{did_you_mean(side, known)}; "
                                 f"configs are: {', '.join(known)}")
            for k, group in enumerate(pair.groups or ()):
                if group not in self.groups:
                    raise at_key(("pairs", i, "groups", k),
                                 f"unknown group {group!r}{did_you_mean(group, groups)}; {declared}")
        return self

    @property
    def group_names(self) -> list[str]:
        """The groups in declaration order (the implicit one when none is declared)."""
        return list(self.groups) or [DEFAULT_GROUP]

    def group(self, name: str) -> VariantGroup:
        return self.groups.get(name) or VariantGroup()

    def configs_in(self, group: str) -> list[str]:
        """The variants of `group`, in name order (seed 004 numbers them)."""
        return sorted(n for n, c in self.configs.items() if c.groups is None or group in c.groups)

    def warmup(self, group: str) -> int:
        own = self.group(group).warmup_steps
        return self.warmup_steps if own is None else own


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `patch` merged in: mappings recursively, anything else replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def run_name(experiment: str, group: str, config: str, *, grouped: bool) -> str:
    """The experiment name a matrix training is recorded under: `demo-matrix/01_recompute`, or with declared
    groups `demo-matrix/F200/01_recompute` (goldens and history are kept per such name)."""
    return f"{experiment}/{group}/{config}" if grouped else f"{experiment}/{config}"


def patched_document(experiment: Mapping[str, Any], matrix: Matrix, group: str, config: str | None
                     ) -> dict[str, Any]:
    """The experiment mapping of one training of the matrix: the reference (`config` None or the reference's
    name) or a variant, in `group`; without `variants` (a variant is no matrix)."""
    doc = {k: v for k, v in experiment.items() if k != "variants"}
    g = matrix.group(group)
    doc = deep_merge(doc, g.patch)
    if g.steps is not None:
        doc = deep_merge(doc, {"training": {"steps": g.steps}})
    if config is not None and config != matrix.reference:
        doc = deep_merge(doc, matrix.configs[config].patch)
    return doc
