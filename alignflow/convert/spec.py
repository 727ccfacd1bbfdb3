"""Conversion specs: the data that says how a MindFormers checkpoint maps onto Megatron's names and layouts.

A spec is a YAML file under `alignflow/convert/specs/` (or the same structure as Python literals):

```yaml
name: twin-moe
description: ...
flavors: [local, te]              # Megatron --transformer-impl variants the spec can write
model: {...}                      # default ModelConfig (used when the experiment gives none)
global_rules:  [...]              # model-level keys (embedding, final norm, output layer)
layer_rules:   [...]              # relative to one transformer layer: every decoder layer and each MTP inner layer
mtp_rules:     [...]              # relative to `mtp.layers.{k}.` (enorm, hnorm, eh_proj, final_layernorm)
ignore:        [glob, ...]        # MindFormers keys dropped on purpose
extra_state:   {global: [...], layer: [...], mtp: [...]}   # modules written as `<module>._extra_state: None` (TE)
```

A rule is `target <- ops(source)`: `{target, source, ops, shape, when, unless, flavors, dtype}`. `target` and
`source` are names (or lists of names) relative to the rule's scope and may hold the capture `{expert}`; `shape`
is the Megatron (target) shape as expressions over the model dimensions of `dims.DIMENSIONS`; `when`/`unless`
name predicates of `dims.PREDICATES`; `ops` come from `ops.OPS`. Layer scopes: `decoder.layers.{i}.` on both
sides; `mtp.layers.{k}.<mindformers_mtp_layer>.` -> `mtp.layers.{k}.<transformer_layer | mtp_model_layer>.`
(the Megatron name depends on the target megatron-core version). Everything is checked when the spec is built,
so a typo in a spec fails at load time with its file and line, not halfway through a conversion.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from alignflow.config.model import ModelConfig
from alignflow.convert.dims import PREDICATES, ExpressionError, parse_expression
from alignflow.convert.ops import EXPRESSION_PARAMS, OPS

Flavor = Literal["local", "te"]
FLAVORS: tuple[Flavor, ...] = ("local", "te")
_TE_ONLY: tuple[Flavor, ...] = ("te",)
CAPTURES = ("expert",)
_CAPTURE = re.compile(r"\{([^{}]*)\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


def _check_pattern(pattern: str) -> str:
    names = _CAPTURE.findall(pattern)
    unknown = [n for n in names if n not in CAPTURES]
    if unknown:
        raise ValueError(f"unknown capture(s) {unknown} in {pattern!r}; known: {list(CAPTURES)}")
    if _CAPTURE.sub("", pattern).count("{") or _CAPTURE.sub("", pattern).count("}"):
        raise ValueError(f"unbalanced braces in {pattern!r}")
    if not pattern or pattern.startswith(".") or pattern.endswith(".") or ".." in pattern:
        raise ValueError(f"malformed key pattern {pattern!r}")
    return pattern


def _check_predicates(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in PREDICATES]
    if unknown:
        raise ValueError(f"unknown predicate(s) {unknown}; known: {', '.join(PREDICATES)}")
    return names


def _check_expression(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"a shape entry must be an integer or an expression, got {value!r}")
    if isinstance(value, str):
        try:
            parse_expression(value)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None


def op_name_and_params(entry: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """`transpose` or `{split: {dim: 0, sections: [...]}}` -> (name, params with defaults filled in)."""
    given: dict[str, Any]
    if isinstance(entry, str):
        name, given = entry, {}
    else:
        if len(entry) != 1:
            raise ValueError(f"an op is a name or a one-key mapping, got {entry!r}")
        ((name, given),) = entry.items()
        given = dict(given or {})
    if name not in OPS:
        raise ValueError(f"unknown op {name!r}; known: {', '.join(OPS)}")
    defaults, _ = OPS[name]
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(f"op {name!r} has no parameter(s) {unknown}; it takes {sorted(defaults) or 'none'}")
    params = {**defaults, **given}
    missing = sorted(k for k, v in params.items() if v is None)
    if missing:
        raise ValueError(f"op {name!r} needs parameter(s) {missing}")
    return name, params


class Rule(_Strict):
    """One mapping `target <- ops(source)` inside a scope."""

    target: str | list[str] = Field(description="Megatron key(s) relative to the scope; may contain {expert}.")
    source: str | list[str] = Field(description="MindFormers key(s) relative to the scope; may contain {expert}.")
    ops: list[str | dict[str, Any]] = Field(default_factory=list, description="Op chain, MindFormers -> Megatron.")
    shape: list[Any] = Field(description="Megatron shape (one target) or list of shapes (a list of targets).")
    when: list[str] = Field(default_factory=list, description="Predicates that must all hold.")
    unless: list[str] = Field(default_factory=list, description="Predicates none of which may hold.")
    flavors: list[Flavor] | None = Field(None, description="Flavours the rule applies to; default: all.")
    dtype: Literal["float32", "bfloat16"] | None = Field(None, description="Required dtype on both sides.")
    note: str | None = Field(None, description="Why the rule is what it is (seed section, assumption).")

    @field_validator("target", "source")
    @classmethod
    def _patterns(cls, v: str | list[str]) -> str | list[str]:
        for p in [v] if isinstance(v, str) else v:
            _check_pattern(p)
        if isinstance(v, list) and not v:
            raise ValueError("needs at least one key")
        return v

    @field_validator("when", "unless")
    @classmethod
    def _predicates(cls, v: list[str]) -> list[str]:
        return _check_predicates(v)

    @field_validator("ops")
    @classmethod
    def _ops(cls, v: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        for entry in v:
            name, params = op_name_and_params(entry)
            for key in EXPRESSION_PARAMS.get(name, ()):
                if not isinstance(params[key], list) or not params[key]:
                    raise ValueError(f"op {name!r}: {key} must be a non-empty list")
                for item in params[key]:
                    _check_expression(item)
        return v

    @model_validator(mode="after")
    def _shape_arity(self) -> Rule:
        if isinstance(self.target, list):
            if len(self.shape) != len(self.target) or not all(isinstance(s, list) for s in self.shape):
                raise ValueError(f"shape must be a list of {len(self.target)} shapes, one per target")
            shapes = self.shape
        else:
            shapes = [self.shape]
        for s in shapes:
            for item in s:
                _check_expression(item)
        multi_target = isinstance(self.target, list) and any("{expert}" in t for t in self.target)
        multi_source = isinstance(self.source, list) and any("{expert}" in s for s in self.source)
        if multi_target or multi_source:
            raise ValueError("{expert} may only appear in a single-key target or source")
        return self


class ExtraState(_Strict):
    """A Megatron module whose `<module>._extra_state` is written as None (Transformer Engine modules)."""

    module: str = Field(description="Module path relative to the scope.")
    when: list[str] = Field(default_factory=list, description="Predicates that must all hold.")
    unless: list[str] = Field(default_factory=list, description="Predicates none of which may hold.")
    flavors: list[Flavor] = Field(default_factory=lambda: list(_TE_ONLY), description="Flavours that have the key.")

    @field_validator("module")
    @classmethod
    def _module(cls, v: str) -> str:
        return _check_pattern(v)

    @field_validator("when", "unless")
    @classmethod
    def _predicates(cls, v: list[str]) -> list[str]:
        return _check_predicates(v)


class ExtraStateSections(_Strict):
    global_: list[ExtraState] = Field(default_factory=list, alias="global", description="Model-level modules.")
    layer: list[ExtraState] = Field(default_factory=list, description="Modules of every transformer layer.")
    mtp: list[ExtraState] = Field(default_factory=list, description="Modules of each MTP block (outside its layer).")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Spec(_Strict):
    """A validated conversion spec."""

    name: str = Field(description="Spec name (`alignflow convert specs`).")
    description: str = Field(description="What model the spec is for, and where its mapping comes from.")
    flavors: list[Flavor] = Field(description="Megatron flavours the spec can write.")
    model: ModelConfig = Field(description="Default model dimensions, used when the experiment gives none.")
    requires: list[str] = Field(default_factory=list, description="ModelConfig sections/fields that must be set.")
    model_constraints: dict[str, list[Any]] = Field(
        default_factory=dict, description="Dotted ModelConfig field -> allowed values (what the rules cover)."
    )
    assumptions: list[str] = Field(default_factory=list, description="What the spec assumes where sources are silent.")
    mindformers_mtp_layer: str = Field("transformer_layer", description="MindFormers name of the MTP inner layer.")
    source_layout: Literal["mindformers", "hf"] = Field(
        "mindformers", description="Whose names the sources are: MindFormers PyNative's (`decoder.layers.{i}.`) or "
        "Hugging Face's (`model.layers.{i}.`, a `<family>-hf` spec).")
    ignore: list[str] = Field(default_factory=list, description="Globs of MindFormers keys dropped on purpose.")
    global_rules: list[Rule] = Field(default_factory=list, description="Model-level rules.")
    layer_rules: list[Rule] = Field(default_factory=list, description="Rules of one transformer layer.")
    mtp_rules: list[Rule] = Field(default_factory=list, description="Rules of one MTP block (outside its layer).")
    extra_state: ExtraStateSections = Field(default_factory=ExtraStateSections,
                                            description="`_extra_state: None` modules per scope.")
    _where: dict[tuple[str, int], str] = PrivateAttr(default_factory=dict)

    @field_validator("flavors")
    @classmethod
    def _flavors(cls, v: list[Flavor]) -> list[Flavor]:
        if not v or len(set(v)) != len(v):
            raise ValueError("list each flavour once, at least one")
        return v

    @field_validator("requires")
    @classmethod
    def _requires(cls, v: list[str]) -> list[str]:
        unknown = [f for f in v if f.split(".")[0] not in ModelConfig.model_fields]
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}")
        return v

    def rule_location(self, section: str, index: int) -> str:
        """`<file>:<line>` of a rule where the spec came from a file, else `<spec>:<section>[<index>]`."""
        return self._where.get((section, index), f"{self.name}:{section}[{index}]")

    def set_locations(self, where: dict[tuple[str, int], str]) -> None:
        self._where = dict(where)
