"""`diagnose_dumps(npu, gpu, mapping) -> Diagnosis`: the first module that diverges, and which kind of bug it is.

Pure: two dumps of the same step (same converted weights, same batch) and the conversion spec's mapping in, one
`Diagnosis` out. The stages are checked in the order a step runs, and the first stage that diverges names the
cause (issue 21):

| stage | first divergence | cause |
|---|---|---|
| loaded weights | a parameter differs after load | `conversion`: conversion or layout |
| forward | M's output differs, its inputs match (innermost such M) | `forward`: a kernel or the config of M, unless |
| | each side's SwiGLU reads its own fc1 rows in another order | `conversion` of that fc1 (the spec hides it) |
| backward | forward equal, a gradient differs (first in backward order) | `backward` |
| update | gradients equal, an update (after minus before) differs | `optimizer`: AdamW, clipping, bf16 write-back |

The GPU side (Megatron) is the reference: its module tree and execution order are the table's, its names the
table's names; the NPU side's are mapped onto them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from alignflow.diagnose.mapping import DumpMapping, ParamMap
from alignflow.diagnose.metrics import TensorDiff, Tolerance, compare_statistics, compare_tensors, worst
from alignflow.frameworks.dumpfile import Call, Dump, TensorReader

CauseKind = Literal["conversion", "forward", "backward", "optimizer"]
CAUSE_TEXT: dict[str, str] = {
    "conversion": "the conversion or the layout: weights differ after load, or reach the GPU in an order its kernels "
                  "read differently (check the spec rule of this tensor)",
    "forward": "forward diverges at this module with equal inputs: a kernel or the configuration of this module",
    "backward": "forward equal, gradients differ: the backward pass",
    "optimizer": "gradients equal, the update differs: the optimizer, gradient clipping or the bf16 write-back",
}
STAGES = ("loaded", "grad", "update")


@dataclass(frozen=True, slots=True)
class ParamRow:
    """One GPU parameter and the NPU parameter(s) it was converted from."""

    name: str
    npu: tuple[str, ...]
    ops: str
    loaded: TensorDiff
    grad: TensorDiff
    update: TensorDiff

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "npu": list(self.npu), "ops": self.ops, "loaded": self.loaded.to_json(),
                "grad": self.grad.to_json(), "update": self.update.to_json()}


@dataclass(frozen=True, slots=True)
class ModuleRow:
    """One module call of the step (GPU execution order), with its own parameters' worst stage metrics."""

    order: int
    module: str
    call_index: int
    gpu_type: str
    npu_module: str | None
    npu_type: str | None
    parent: int | None  # order of the enclosing call
    input: TensorDiff | None  # the first tensor input (the hidden states)
    output: TensorDiff | None
    params: tuple[ParamRow, ...] = ()
    aux: TensorDiff | None = None  # the worst other input (rotary tables, masks, routing probabilities)
    aux_index: int | None = None  # which input position that is

    @property
    def aux_diverged(self) -> bool:
        return self.aux is not None and self.aux.diverged

    @property
    def event(self) -> bool:
        """Something differs here: the output, or an input that did not come in through the hidden states."""
        return (self.output is not None and self.output.diverged) or self.aux_diverged

    @property
    def input_diverged(self) -> bool:
        return self.input is not None and self.input.diverged

    @property
    def label(self) -> str:
        return self.module if self.call_index == 0 else f"{self.module} (call {self.call_index + 1})"

    def stage(self, stage: str) -> TensorDiff | None:
        return worst([getattr(p, stage) for p in self.params]) if self.params else None

    def to_json(self) -> dict[str, Any]:
        def j(d: TensorDiff | None) -> dict[str, Any] | None:
            return d.to_json() if d is not None else None

        return {"order": self.order, "module": self.module, "call_index": self.call_index, "gpu_type": self.gpu_type,
                "npu_module": self.npu_module, "npu_type": self.npu_type, "parent": self.parent,
                "input": j(self.input), "aux_input": j(self.aux), "aux_index": self.aux_index,
                "output": j(self.output), "loaded": j(self.stage("loaded")),
                "grad": j(self.stage("grad")), "update": j(self.stage("update")),
                "params": [p.to_json() for p in self.params]}


@dataclass(frozen=True, slots=True)
class Cause:
    kind: CauseKind
    module: str  # a GPU module name, or "optimizer"
    row: int | None  # ModuleRow.order
    summary: str
    details: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "module": self.module, "row": self.row, "summary": self.summary,
                "explanation": CAUSE_TEXT[self.kind], "details": list(self.details)}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The outcome: a verdict, the cause (None when both sides agree), the module table and what was mapped."""

    verdict: Literal["pass", "diverged"]
    cause: Cause | None
    step: int
    rows: tuple[ModuleRow, ...]
    mapping: DumpMapping
    tolerance: Tolerance
    scalars: dict[str, dict[str, float | None]]
    optimizer: dict[str, dict[str, Any]]
    unmatched: dict[str, list[str]]
    notes: tuple[str, ...] = ()
    dumps: dict[str, str] = field(default_factory=dict)
    dump_bytes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The diagnosis JSON (`alignflow diagnose --json`; `diagnosis.json` of the step's outputs)."""
        return {"verdict": self.verdict, "cause": self.cause.to_json() if self.cause else None, "step": self.step,
                "first_divergent_row": self.cause.row if self.cause else None,
                "rows": [r.to_json() for r in self.rows], "mapping": self.mapping.to_json(),
                "tolerance": self.tolerance.to_json(), "scalars": self.scalars, "optimizer": self.optimizer,
                "unmatched": self.unmatched, "notes": list(self.notes), "dumps": self.dumps,
                "dump_bytes": self.dump_bytes}


def diagnose_dumps(npu: Dump, gpu: Dump, mapping: DumpMapping, tolerance: Tolerance | None = None) -> Diagnosis:
    """Compare two dumps of one step; locate and classify the first divergence."""
    tol = tolerance or Tolerance()
    notes: list[str] = [*(f"npu: {n}" for n in npu.notes), *(f"gpu: {n}" for n in gpu.notes)]
    if npu.step != gpu.step:
        notes.append(f"the dumps are of different steps (NPU {npu.step}, GPU {gpu.step})")
    with npu.reader() as nr, gpu.reader() as gr:
        params, unmapped = _param_rows(npu, gpu, nr, gr, mapping, tol)
        rows, unmatched_calls = _module_rows(npu, gpu, nr, gr, mapping, tol, params)
    placed = {p.name for r in rows for p in r.params}
    orphans = [p for name, p in params.items() if name not in placed]
    if orphans:  # parameters of modules that were never called as modules: one extra row
        rows.append(ModuleRow(len(rows), "(parameters outside module calls)", 0, "", None, None, None, None, None,
                              tuple(orphans)))
    cause = _cause(rows, npu, gpu, mapping, tol)
    scalars = {k: {"npu": npu.scalars.get(k), "gpu": gpu.scalars.get(k)}
               for k in sorted(set(npu.scalars) | set(gpu.scalars))}
    optimizer = {k: {"npu": npu.optimizer.get(k), "gpu": gpu.optimizer.get(k)}
                 for k in sorted(set(npu.optimizer) | set(gpu.optimizer))}
    lr = gpu.scalars.get("lr")
    if lr == 0.0:
        notes.append(f"the learning rate of step {gpu.step} is 0 (warm-up): both updates are zero, so optimizer "
                     "differences cannot show; diagnose a later step (--step)")
    return Diagnosis("diverged" if cause else "pass", cause, gpu.step, tuple(rows), mapping, tol, scalars, optimizer,
                     {**unmatched_calls, **unmapped}, tuple(notes), {"npu": str(npu.path), "gpu": str(gpu.path)},
                     {"npu": npu.bytes, "gpu": gpu.bytes})


def _diff(nr: TensorReader, gr: TensorReader, nk: str | None, gk: str | None, tol: Tolerance,
          input_rel: float | None = None) -> TensorDiff:
    a, b = nr.get(nk), gr.get(gk)
    if (a is None or b is None) and (nr.stats(nk) is not None and gr.stats(gk) is not None):
        return compare_statistics(nr.stats(nk), gr.stats(gk), tol)  # a statistics dump on either side
    return compare_tensors(a, b, tol, input_rel=input_rel)


def _output_diff(nr: TensorReader, gr: TensorReader, nk: str | None, gk: str | None, tol: Tolerance,
                 input_rel: float | None, rule: ParamMap | None) -> TensorDiff:
    """An output, with the NPU features reordered as the module's weight rows were (a de-interleaved fc1 emits
    `[g0, u0, g1, u1, ...]` where Megatron's emits `[gate; up]`)."""
    a, b = nr.get(nk), gr.get(gk)
    if rule is not None and a is not None and b is not None and a.size == b.size and a.shape[-1] == b.shape[-1]:
        entry = a.shape[-1]
        perm = rule.row_permutation(entry, 1)
        if perm is not None:
            a = np.asarray(a)[..., perm]
            return compare_tensors(a, b, tol, input_rel=input_rel)
    return _diff(nr, gr, nk, gk, tol, input_rel)


def _param_rows(npu: Dump, gpu: Dump, nr: TensorReader, gr: TensorReader, mapping: DumpMapping, tol: Tolerance
                ) -> tuple[dict[str, ParamRow], dict[str, list[str]]]:
    rows: dict[str, ParamRow] = {}
    used_npu: set[str] = set()
    for m in mapping.params:
        if not all(s in npu.params for s in m.sources):
            continue
        used_npu.update(m.sources)
        values: dict[str, list[Any]] = {}
        for stage in ("loaded", "grad", "updated"):
            arrays = [a for s in m.sources if (a := nr.get(getattr(npu.params[s], stage))) is not None]
            values[stage] = m.apply(arrays) if len(arrays) == len(m.sources) else [None] * len(m.targets)
        for i, target in enumerate(m.targets):
            entry = gpu.params.get(target)
            if entry is None:
                continue
            g = {stage: gr.get(getattr(entry, stage)) for stage in ("loaded", "grad", "updated")}
            n = {stage: values[stage][i] for stage in values}
            rows[target] = ParamRow(
                target, m.sources, m.ops_text,
                compare_tensors(n["loaded"], g["loaded"], tol),
                compare_tensors(n["grad"], g["grad"], tol),
                compare_tensors(_delta(n), _delta(g), tol, rel_floor=tol.update_rel_floor))
    unmapped = {
        "gpu_parameters_not_mapped": sorted(set(gpu.params) - set(rows)),
        "npu_parameters_not_mapped": sorted(set(npu.params) - used_npu),
    }
    return rows, unmapped


def _delta(values: dict[str, Any]) -> Any:
    if values.get("updated") is None or values.get("loaded") is None:
        return None
    return np.asarray(values["updated"], dtype=np.float64) - np.asarray(values["loaded"], dtype=np.float64)


def _module_rows(npu: Dump, gpu: Dump, nr: TensorReader, gr: TensorReader, mapping: DumpMapping, tol: Tolerance,
                 params: dict[str, ParamRow]) -> tuple[list[ModuleRow], dict[str, list[str]]]:
    npu_calls: dict[tuple[str, int], Call] = {(mapping.gpu_module(c.module), c.index): c for c in npu.calls}
    by_module: dict[str, list[ParamRow]] = {}
    for name, row in params.items():
        by_module.setdefault(name.rsplit(".", 1)[0], []).append(row)
    order_of = {c.id: i for i, c in enumerate(gpu.calls)}
    rows: list[ModuleRow] = []
    matched: set[int] = set()
    for i, c in enumerate(gpu.calls):
        n = npu_calls.get((c.module, c.index))
        inp = out = aux = None
        aux_index = None
        if n is not None:
            matched.add(n.id)
            ins = [_diff(nr, gr, a, b, tol) for a, b in zip(n.inputs, c.inputs, strict=False)]
            inp = ins[0] if ins else None
            if len(ins) > 1:
                aux = worst(ins[1:])
                aux_index = 1 + ins[1:].index(aux) if aux is not None else None
            in_rel = inp.rel_l2 if inp is not None and inp.compared else None
            outs = [_output_diff(nr, gr, a, b, tol, in_rel, mapping.weight_rule(c.module) if j == 0 else None)
                    for j, (a, b) in enumerate(zip(n.outputs, c.outputs, strict=False))]
            out = worst(outs)
        own = tuple(by_module.pop(c.module, [])) if c.index == 0 else ()
        rows.append(ModuleRow(i, c.module, c.index, c.type, n.module if n else None, n.type if n else None,
                              order_of.get(c.parent) if c.parent is not None else None, inp, out, own, aux,
                              aux_index))
    unmatched = {"gpu_calls_without_npu": [c.label for c in gpu.calls if (c.module, c.index) not in npu_calls],
                 "npu_calls_without_gpu": [c.label for c in npu.calls if c.id not in matched]}
    return rows, unmatched


def _cause(rows: list[ModuleRow], npu: Dump, gpu: Dump, mapping: DumpMapping, tol: Tolerance) -> Cause | None:
    for r in rows:  # 1. weights after load, in execution order
        bad = [p for p in r.params if p.loaded.diverged]
        if bad:
            total = sum(1 for x in rows for p in x.params if p.loaded.diverged)
            return Cause("conversion", r.module, r.order, f"{bad[0].name} differs after load", tuple(
                [f"{p.name} <- {', '.join(p.npu)} ({p.ops}): cosine {_f(p.loaded.cosine)}, max abs "
                 f"{_f(p.loaded.max_abs)}" for p in bad] + [f"{total} parameter(s) differ after load in all"]))
    first = next((r for r in rows if r.event), None)
    if first is not None:  # 2. forward: descend to the innermost module whose hidden-state input still matches
        m = first
        while True:
            kids = [r for r in rows if r.parent == m.order]
            nxt = next((k for k in kids if k.event), None)
            if nxt is None or nxt.input_diverged:
                break
            m = nxt
        details = [f"output: cosine {_f(m.output.cosine if m.output else None)}, relative L2 "
                   f"{_f(m.output.rel_l2 if m.output else None)}"]
        if m.aux_diverged and m.aux is not None:
            details.append(f"its input #{m.aux_index} ({m.aux.gpu_shape}) differs (relative L2 {_f(m.aux.rel_l2)}): "
                           "computed outside any module and passed in (rotary tables, attention mask, routing)")
        kids = [r for r in rows if r.parent == m.order]
        first_bad = next((k.label for k in kids if k.input_diverged), None)
        if first_bad:
            last_ok = [k.label for k in kids if not k.event and not k.input_diverged]
            details.append(f"inside {m.label}: {', '.join(last_ok) or 'no sub-module'} agree, the input of "
                           f"{first_bad} already differs — the computation between them")
        if m.input_diverged:
            details.append("its inputs already differ: the divergence comes from computation outside any module "
                           "before it")
        layout = _gated_fc1_layout(m, rows, npu, gpu, mapping, tol)
        if layout is not None:
            return layout
        return Cause("forward", m.module, m.order, f"{m.label} ({m.gpu_type}) diverges first", tuple(details))
    for r in reversed(rows):  # 3. backward order
        bad = [p for p in r.params if p.grad.diverged]
        if bad:
            return Cause("backward", r.module, r.order, f"the gradient of {bad[0].name} differs first (backward "
                         "order)", tuple(f"{p.name}: cosine {_f(p.grad.cosine)}" for p in bad))
    bad_updates = [(r, p) for r in rows for p in r.params if p.update.diverged]
    if bad_updates:  # 4. the optimizer
        details = [f"{len(bad_updates)} parameter update(s) differ, e.g. {bad_updates[0][1].name} (cosine "
                   f"{_f(bad_updates[0][1].update.cosine)}, relative L2 {_f(bad_updates[0][1].update.rel_l2)})"]
        for key in sorted(set(npu.optimizer) | set(gpu.optimizer)):
            if npu.optimizer.get(key) != gpu.optimizer.get(key):
                details.append(f"optimizer setting {key}: NPU {npu.optimizer.get(key)!r}, "
                               f"GPU {gpu.optimizer.get(key)!r}")
        for key in ("clip_coeff", "lr"):
            a, b = npu.scalars.get(key), gpu.scalars.get(key)
            if a is not None and b is not None and abs(a - b) > tol.rel_floor * max(abs(b), 1e-30):
                details.append(f"{key}: NPU {a:.6g}, GPU {b:.6g}")
        return Cause("optimizer", "optimizer", bad_updates[0][0].order, "the parameter updates differ while the "
                     "gradients agree", tuple(details))
    return None


_SPLITS = {"interleaved [g0, u0, g1, u1, ...]": (slice(0, None, 2), slice(1, None, 2)),
           "[gate; up]": (None, None)}  # None: the two halves


def _swiglu(x: npt.NDArray[Any], split: str) -> npt.NDArray[np.float64]:
    x = np.asarray(x, dtype=np.float64)
    gate_at, up_at = _SPLITS[split]
    if gate_at is None:
        gate, up = np.split(x, 2, axis=-1)
    else:
        gate, up = x[..., gate_at], x[..., up_at]
    out: npt.NDArray[np.float64] = gate / (1.0 + np.exp(-gate)) * up
    return out


def _split_of(fc1_out: npt.NDArray[Any] | None, fc2_in: npt.NDArray[Any] | None, tol: Tolerance) -> str | None:
    """Which row layout of `linear_fc1` this side's SwiGLU reads: the split of its fc1 output that reproduces its own
    fc2 input (one side's tensors only, so no mapping is involved)."""
    if fc1_out is None or fc2_in is None or fc1_out.shape[-1] != 2 * fc2_in.shape[-1] or fc1_out.shape[-1] < 4:
        return None
    found = [split for split in _SPLITS if compare_tensors(_swiglu(fc1_out, split), fc2_in, tol).status == "match"]
    return found[0] if len(found) == 1 else None


def _gated_fc1_layout(m: ModuleRow, rows: list[ModuleRow], npu: Dump, gpu: Dump, mapping: DumpMapping,
                      tol: Tolerance) -> Cause | None:
    """A SwiGLU MLP whose `linear_fc1` agrees (through the spec) while the input of its `linear_fc2` already differs:
    when each side's fc2 input is the SwiGLU of its own fc1 output read in a different row layout, the weights
    reached Megatron in the wrong row order. The spec mapped them the same way it converted them, so they agreed
    after load: a conversion (layout) bug that shows first in the forward pass."""
    kids = {r.module.rsplit(".", 1)[-1]: r for r in rows if r.parent == m.order}
    fc1, fc2 = kids.get("linear_fc1"), kids.get("linear_fc2")
    if fc1 is None or fc2 is None or fc1.event or not fc2.input_diverged:
        return None
    npu_calls = {(mapping.gpu_module(c.module), c.index): c for c in npu.calls}
    g1, g2 = gpu.calls[fc1.order], gpu.calls[fc2.order]
    n1, n2 = npu_calls.get((g1.module, g1.index)), npu_calls.get((g2.module, g2.index))
    if n1 is None or n2 is None or not (n1.outputs and n2.inputs and g1.outputs and g2.inputs):
        return None
    with npu.reader() as nr, gpu.reader() as gr:
        npu_split = _split_of(nr.get(n1.outputs[0]), nr.get(n2.inputs[0]), tol)
        gpu_split = _split_of(gr.get(g1.outputs[0]), gr.get(g2.inputs[0]), tol)
    if npu_split is None or gpu_split is None or npu_split == gpu_split:
        return None
    rule = mapping.weight_rule(fc1.module)
    where = f"the rule {rule.rule} ({rule.ops_text})" if rule is not None else "its conversion rule"
    return Cause("conversion", fc1.module, fc1.order,
                 f"the rows of {fc1.module}.weight are in the wrong order for the GPU: its SwiGLU reads them as "
                 f"{gpu_split}, the NPU's as {npu_split}", (
                     f"each side's {fc2.label} input is the SwiGLU of its own {fc1.label} output read as "
                     f"{npu_split} (NPU) and {gpu_split} (GPU); the weights agree after load only because the "
                     "diagnosis maps them with the same spec that converted them",
                     f"{where} must turn {npu_split} rows into {gpu_split} rows"
                     + (" (deinterleave_rows)" if gpu_split == "[gate; up]" else " (interleave_rows)"),
                     f"first seen in {m.label}: {fc1.label} agrees, the input of {fc2.label} differs"))


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6g}"
