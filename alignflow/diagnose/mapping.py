"""Names and layouts of one side's dump in the other side's terms, from the experiment's conversion spec.

The conversion spec already knows every MindFormers <-> Megatron parameter name and layout (issue 21: the one
thing msprobe lacks). A parameter of the NPU dump is compared with the GPU parameter it was converted into by
running the spec's own op chain over it — a de-interleaved `linear_fc1` is compared with its source rows, a
grouped `experts.weight1 [E, H, 2F]` with each expert's `[2F, H]` — and the same chain maps its gradient and its
update (every op only moves elements; casts are left out: comparisons are in fp32).

Module paths follow from the same rules: where a rule maps `a.X.b.weight` to `a.Y.b.weight`, the module
`a.X` of the NPU side is `a.Y` on the GPU side (the MTP inner layer `transformer_layer` -> `mtp_model_layer`).
A rule whose leaf names differ (`shared_experts_gate.weight` -> `gate_weight`) maps the parameter only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # the ops import torch: a controller that only reads a diagnosis (the compare step) needs neither
    from alignflow.convert.ops import Op
    from alignflow.convert.plan import Plan


@dataclass(frozen=True, slots=True)
class ParamMap:
    """NPU parameters `sources` -> `ops` -> GPU parameters `targets` (one expanded rule of the spec)."""

    rule: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    ops: tuple[Op, ...]

    @property
    def ops_text(self) -> str:
        return " -> ".join(type(op).__name__ for op in self.ops) or "rename"

    def apply(self, tensors: list[npt.NDArray[Any]]) -> list[npt.NDArray[np.float64]]:
        """Run the rule's layout ops (not its casts) over NPU tensors; GPU-layout tensors out."""
        import torch

        from alignflow.convert.ops import Cast, apply_chain

        ops = [op for op in self.ops if not isinstance(op, Cast)]
        out = apply_chain(ops, [torch.from_numpy(np.asarray(t, dtype=np.float64)) for t in tensors])
        return [t.contiguous().numpy() for t in out]

    def row_permutation(self, rows: int, cols: int) -> npt.NDArray[np.int64] | None:
        """Where the rule only reorders the rows of one `[rows, cols]` weight (a de-interleave), the GPU row `i`
        is NPU row `perm[i]` — and so is feature `i` of the module's output; None for any other rule."""
        if len(self.sources) != 1 or len(self.targets) != 1:
            return None
        index = np.repeat(np.arange(rows, dtype=np.float64)[:, None], cols, axis=1)
        try:
            (out,) = self.apply([index])
        except (RuntimeError, ValueError):
            return None
        if out.shape != (rows, cols) or not (out == out[:, :1]).all():
            return None
        perm = out[:, 0].astype(np.int64)
        return None if (perm == np.arange(rows)).all() else perm


@dataclass(frozen=True, slots=True)
class DumpMapping:
    """How NPU dump names translate to GPU ones: parameters through rules, modules through prefix renames."""

    spec: str
    params: tuple[ParamMap, ...]
    renames: tuple[tuple[str, str], ...]  # NPU module prefix -> GPU module prefix, longest first

    def weight_rule(self, gpu_module: str) -> ParamMap | None:
        """The rule producing `<gpu_module>.weight`, if any."""
        name = f"{gpu_module}.weight"
        return next((m for m in self.params if m.targets == (name,)), None)

    def gpu_module(self, npu_module: str) -> str:
        for src, dst in self.renames:
            if npu_module == src or npu_module.startswith(src + "."):
                return dst + npu_module[len(src):]
        return npu_module

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec,
                "modules": [{"npu": s, "gpu": t} for s, t in self.renames],
                "parameters": [{"npu": list(m.sources), "gpu": list(m.targets), "ops": m.ops_text, "rule": m.rule}
                               for m in self.params]}


def mapping_from_plan(plan: Plan) -> DumpMapping:
    """The dump mapping of an expanded conversion plan (local flavour: the GPU model's own names)."""
    return mapping_from_params(plan.spec, [ParamMap(m.rule, m.sources, m.targets, m.ops) for m in plan.mappings])


def mapping_from_params(spec: str, params: Iterable[ParamMap]) -> DumpMapping:
    """A dump mapping from parameter rules; module renames follow from the rules that keep their leaf names."""
    rules = tuple(params)
    return DumpMapping(spec, rules, _renames((m.sources[0], m.targets[0]) for m in rules
                                             if len(m.sources) == 1 and len(m.targets) == 1))


def _renames(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    found: dict[str, set[str]] = {}
    for src, dst in pairs:
        s, t = src.split("."), dst.split(".")
        common = 0
        while common < min(len(s), len(t)) and s[-1 - common] == t[-1 - common]:
            common += 1
        if common < 1 or len(s) != len(t):  # another leaf, or a moved parameter (`mlp.expert_bias` ->
            continue                         # `mlp.router.expert_bias`): a parameter rename, not a module one
        a, b = ".".join(s[:-common]), ".".join(t[:-common])
        if a != b and a and b:
            found.setdefault(a, set()).add(b)
    unique = {a: next(iter(bs)) for a, bs in found.items() if len(bs) == 1}
    # keep the shortest prefix of each family: `mtp.layers.0.transformer_layer` covers its sub-modules
    kept = {a: b for a, b in unique.items()
            if not any(a != p and a.startswith(p + ".") and b == q + a[len(p):] for p, q in unique.items())}
    return tuple(sorted(kept.items(), key=lambda kv: -len(kv[0])))


def mapping_for(experiment: Any) -> DumpMapping:
    """The dump mapping of an experiment: NPU-side names to GPU-side names, from the names of the checkpoint each
    side loads (`alignflow.pipeline.NAMING`) and the family's conversion spec expanded for its model (local
    names). Two sides with the same names map each parameter to itself."""
    from alignflow.backends.registry import megatron_version_of, pipeline_for
    from alignflow.convert.formats import spec_for
    from alignflow.convert.ops import inverse_chain
    from alignflow.convert.plan import build_plan
    from alignflow.convert.registry import load_spec
    from alignflow.errors import ConfigError
    from alignflow.pipeline import NAMING

    pipe = pipeline_for(experiment)
    npu, gpu = (NAMING[pipe.load_format(side)] for side in ("npu", "gpu"))
    if experiment.conversion is None:
        raise ConfigError(f"{experiment.source or experiment.name}: diagnose maps the sides' parameters through the "
                          "model family's conversion spec: give `conversion: {spec: <family>}`")
    # the spec whose source side carries the non-Megatron names (`<spec>-hf` for Hugging Face names)
    other = npu if npu != "megatron" else gpu
    spec = spec_for("hf", experiment.spec_ref) if other == "hf" else load_spec(experiment.spec_ref)
    try:
        plan = build_plan(spec, experiment.model, flavor="local", megatron_version=megatron_version_of(experiment))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if plan.problems:
        raise ConfigError(f"conversion spec {spec.name} does not fit the experiment's model: "
                          + "; ".join(plan.problems))
    if npu == gpu:
        keys = plan.targets if npu == "megatron" else plan.sources
        return mapping_from_params(spec.name, [ParamMap("same names on both sides", (k,), (k,), ()) for k in keys])
    if gpu == "megatron":
        return mapping_from_plan(plan)
    if npu == "megatron":
        return mapping_from_params(spec.name, [ParamMap(m.rule, m.targets, m.sources, inverse_chain(m.ops))
                                               for m in plan.mappings])
    raise ConfigError(f"diagnose: no mapping from {npu} names (NPU side) to {gpu} names (GPU side); one side "
                      "must carry Megatron's names, or both the same")
