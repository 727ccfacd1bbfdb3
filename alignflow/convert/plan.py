"""Expand a spec for one model, flavour and megatron-core version into concrete key mappings.

The plan is target-driven: it enumerates every Megatron key the model has (layers, experts, MTP blocks) from
the model config, each with the MindFormers keys it is made from, the op chain and both sides' shapes. Shapes
of the MindFormers side are derived by running the inverse op chain over the declared Megatron shapes, so the
whole checkpoint can be checked from its headers before any tensor is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from alignflow.config.model import ModelConfig
from alignflow.convert.dims import PREDICATES, ExpressionError, evaluate, model_dimensions, model_field
from alignflow.convert.layout import MTP_INNER_LAYER as MTP_INNER_LAYER
from alignflow.convert.layout import mtp_inner_layer
from alignflow.convert.layout import parse_version as parse_version
from alignflow.convert.ops import EXPRESSION_PARAMS, OPS, Op, Shape, ShapeError, chain_shapes, inverse_chain
from alignflow.convert.spec import ExtraState, Flavor, Rule, Spec, op_name_and_params


@dataclass(frozen=True, slots=True)
class KeyMap:
    """One expanded rule: MindFormers `sources` -> `ops` -> Megatron `targets`."""

    rule: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    ops: tuple[Op, ...]
    source_shapes: tuple[Shape, ...]
    target_shapes: tuple[Shape, ...]
    dtype: str | None


@dataclass(frozen=True, slots=True)
class Plan:
    """Every key of the conversion of one model, plus the problems of the model itself (unsupported settings)."""

    spec: str
    flavor: Flavor
    megatron_version: str
    mappings: tuple[KeyMap, ...]
    extra_state: tuple[str, ...]  # Megatron keys written as `None`
    ignore: tuple[str, ...]  # MindFormers globs dropped on purpose
    problems: tuple[str, ...]

    @property
    def targets(self) -> list[str]:
        return [t for m in self.mappings for t in m.targets]

    @property
    def sources(self) -> list[str]:
        return [s for m in self.mappings for s in m.sources]

    def source_shapes(self) -> dict[str, Shape]:
        """MindFormers key -> shape: the synthetic state dict of a spec's documented shapes."""
        return {k: s for m in self.mappings for k, s in zip(m.sources, m.source_shapes, strict=True)}

    def target_shapes(self) -> dict[str, Shape]:
        return {k: s for m in self.mappings for k, s in zip(m.targets, m.target_shapes, strict=True)}


@dataclass(frozen=True, slots=True)
class _Scope:
    section: str  # global_rules | layer_rules | mtp_rules
    source_prefix: str
    target_prefix: str
    layer: int | None  # decoder layer index the predicates are evaluated for


# where one decoder layer's sources live, by the spec's source layout (the Megatron side is always decoder.layers.{i}.)
SOURCE_LAYER_PREFIX = {"mindformers": "decoder.layers.{i}.", "hf": "model.layers.{i}."}


def _scopes(spec: Spec, model: ModelConfig, inner: str) -> Iterator[_Scope]:
    yield _Scope("global_rules", "", "", None)
    source = SOURCE_LAYER_PREFIX[spec.source_layout]
    for i in range(model.num_layers):
        yield _Scope("layer_rules", source.format(i=i), f"decoder.layers.{i}.", i)
    for k in range(model.mtp.num_layers if model.mtp is not None else 0):
        yield _Scope("mtp_rules", f"mtp.layers.{k}.", f"mtp.layers.{k}.", None)
        # Megatron builds the MTP inner layer from the last decoder layer's spec (docs/megatron.md#mtp-layers).
        yield _Scope("layer_rules", f"mtp.layers.{k}.{spec.mindformers_mtp_layer}.", f"mtp.layers.{k}.{inner}.",
                     model.num_layers - 1)


def _applies(item: Rule | ExtraState, model: ModelConfig, layer: int | None, flavor: Flavor) -> bool:
    if item.flavors is not None and flavor not in item.flavors:
        return False
    return all(PREDICATES[p](model, layer) for p in item.when) and not any(
        PREDICATES[p](model, layer) for p in item.unless)


def _expand(pattern: str, prefix: str, experts: int | None) -> list[str]:
    if "{expert}" not in pattern:
        return [prefix + pattern]
    if experts is None:
        raise ExpressionError(f"{pattern!r} has {{expert}} but the model has no moe section")
    return [prefix + pattern.replace("{expert}", str(e)) for e in range(experts)]


def _bind_ops(rule: Rule, dims: dict[str, int]) -> tuple[Op, ...]:
    out = []
    for entry in rule.ops:
        name, params = op_name_and_params(entry)
        for key in EXPRESSION_PARAMS.get(name, ()):
            params[key] = [evaluate(x, dims) for x in params[key]]
        out.append(OPS[name][1](params))
    return tuple(out)


def _model_problems(spec: Spec, model: ModelConfig) -> list[str]:
    problems = []
    for field in spec.requires:
        if model_field(model, field) is None:
            problems.append(f"model.{field} is not set, but spec {spec.name} needs it")
    for field, allowed in spec.model_constraints.items():
        value = model_field(model, field)
        if value not in allowed:
            problems.append(f"model.{field} = {value!r}: spec {spec.name} covers only {allowed}")
    if model.padded_vocab_size != model.vocab_size:
        problems.append(f"model.vocab_size {model.vocab_size} pads to {model.padded_vocab_size} in Megatron "
                        f"(make_vocab_size_divisible_by {model.make_vocab_size_divisible_by}); the padded rows would "
                        "enter the softmax: choose a divisor of the vocabulary")
    return problems


def _refuse_local(spec: Spec, model: ModelConfig, megatron_version: str) -> None:
    """A local-flavour checkpoint of a model no local (non-TE) spec of that megatron-core builds would load into
    nothing: refuse it, naming where Megatron stops (`alignflow.frameworks.megatron_refusals`)."""
    from alignflow.frameworks.megatron_refusals import model_te_requirements, needs_te_what

    major, minor = parse_version(megatron_version)
    variant = "dsa" if model.dsa is not None else "gated_delta_net" if model.linear_attention is not None else None
    needs = model_te_requirements(mla=model.mla is not None, variant=variant, series=f"{major}.{minor}")
    if needs:
        args = {"experimental_attention_variant": variant}
        why = "; ".join(f"{needs_te_what(r, args)}: {r.error} ({r.source[f'{major}.{minor}']})" for r in needs)
        raise ValueError(f"spec {spec.name}: no local (non-Transformer-Engine) layer spec of megatron-core "
                         f"{major}.{minor} builds this model — {why}; convert with --flavor te (gpu.transformer_impl "
                         "transformer_engine)")


def build_plan(spec: Spec, model: ModelConfig | None = None, *, flavor: Flavor = "local",
               megatron_version: str = "0.16") -> Plan:
    """Expand `spec` for `model` (default: the spec's own). Problems of the model are in `Plan.problems`;
    shape inconsistencies between a rule and the model become problems too, naming the rule and its keys."""
    model = model if model is not None else spec.model
    if flavor == "local":
        _refuse_local(spec, model, megatron_version)
    if flavor not in spec.flavors:
        raise ValueError(f"spec {spec.name} has no {flavor!r} flavour; it writes: {', '.join(spec.flavors)}")
    inner = mtp_inner_layer(megatron_version)
    dims = model_dimensions(model)
    experts = dims.get("experts")
    problems = _model_problems(spec, model)
    mappings: list[KeyMap] = []
    extra: list[str] = []
    owner: dict[str, str] = {}
    for scope in _scopes(spec, model, inner):
        rules: list[Rule] = getattr(spec, scope.section)
        for index, rule in enumerate(rules):
            if not _applies(rule, model, scope.layer, flavor):
                continue
            where = spec.rule_location(scope.section, index)
            try:
                expanded = _mappings(rule, where, scope, dims, experts)
            except (ExpressionError, ShapeError) as exc:
                problems.append(f"rule {where} at {scope.target_prefix or 'model level'}: {exc}")
                continue
            for mapping in expanded:
                for t in mapping.targets:
                    if t in owner:
                        problems.append(f"target key {t!r} produced twice: by {owner[t]} and {where}")
                    owner[t] = where
            mappings += expanded
        section = {"global_rules": spec.extra_state.global_, "layer_rules": spec.extra_state.layer,
                   "mtp_rules": spec.extra_state.mtp}[scope.section]
        extra += [f"{scope.target_prefix}{e.module}._extra_state" for e in section
                  if _applies(e, model, scope.layer, flavor)]
    consumer: dict[str, str] = {}
    for m in mappings:
        for s in m.sources:
            if s in consumer:
                problems.append(f"source key {s!r} consumed twice: by {consumer[s]} and {m.rule}")
            consumer[s] = m.rule
    return Plan(spec=spec.name, flavor=flavor, megatron_version=megatron_version, mappings=tuple(mappings),
                extra_state=tuple(extra), ignore=tuple(spec.ignore), problems=tuple(problems))


def _mappings(rule: Rule, where: str, scope: _Scope, dims: dict[str, int], experts: int | None) -> list[KeyMap]:
    """One mapping; or one per expert where both sides name `{expert}` (a per-expert rename)."""
    targets_p = rule.target if isinstance(rule.target, list) else [rule.target]
    sources_p = rule.source if isinstance(rule.source, list) else [rule.source]
    if len(targets_p) == len(sources_p) == 1 and "{expert}" in targets_p[0] and "{expert}" in sources_p[0]:
        if experts is None:
            raise ExpressionError(f"{targets_p[0]!r} has {{expert}} but the model has no moe section")
        return [_mapping(rule, where, [targets_p[0].replace("{expert}", str(e))],
                         [sources_p[0].replace("{expert}", str(e))], scope, dims, experts) for e in range(experts)]
    return [_mapping(rule, where, targets_p, sources_p, scope, dims, experts)]


def _mapping(rule: Rule, where: str, targets_p: list[str], sources_p: list[str], scope: _Scope,
             dims: dict[str, int], experts: int | None) -> KeyMap:
    shapes_p = rule.shape if isinstance(rule.target, list) else [rule.shape]
    ops = _bind_ops(rule, dims)
    targets = [t for p in targets_p for t in _expand(p, scope.target_prefix, experts)]
    sources = [s for p in sources_p for s in _expand(p, scope.source_prefix, experts)]
    per_target = [tuple(evaluate(x, dims) for x in s) for s in shapes_p]
    target_shapes = per_target * len(targets) if len(per_target) == 1 else per_target
    source_shapes = chain_shapes(inverse_chain(ops), list(target_shapes))
    if len(source_shapes) != len(sources):
        raise ShapeError(f"ops turn {len(targets)} target(s) into {len(source_shapes)} source tensor(s), the rule "
                         f"names {len(sources)}")
    if chain_shapes(ops, list(source_shapes)) != list(target_shapes):
        raise ShapeError("the op chain does not reproduce the target shapes (an op and its inverse disagree)")
    return KeyMap(rule=where, sources=tuple(sources), targets=tuple(targets), ops=ops,
                  source_shapes=tuple(source_shapes), target_shapes=tuple(target_shapes), dtype=rule.dtype)


def natural_key(key: str) -> tuple[Any, ...]:
    """Sort `decoder.layers.10` after `decoder.layers.9`."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))
