"""Step 3 of the pipeline and its reverse: MindFormers <-> Megatron legacy, driven by a spec, fail-closed.

Order of work: expand the spec into a plan (every Megatron key of the model), check the source checkpoint's
headers against it (every target produced once, every source key consumed or ignored, every shape and
required dtype right), raise one `ConversionError` listing *all* problems if there is any, and only then read
tensors one rule at a time into a staged output directory that is renamed into place last.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from alignflow.config.model import ModelConfig
from alignflow.config.parallel import ParallelConfig
from alignflow.convert.bf16 import drop_reason
from alignflow.convert.layout import COMMON_JSON, TRACKER, iteration_dir_name, model_file_name, mtp_inner_layer
from alignflow.convert.megatron import open_megatron, write_megatron
from alignflow.convert.mindformers import DEFAULT_PREFIX, common_json, open_mindformers
from alignflow.convert.ops import DTYPES, Cast, Op, Shape, apply_chain, inverse_chain
from alignflow.convert.plan import Plan, build_plan, natural_key
from alignflow.convert.registry import load_spec
from alignflow.convert.spec import Flavor, Spec
from alignflow.convert.summary import CkptFormat, ConversionSummary, ProgressFn, dtype_counts, staged_output
from alignflow.convert.tensor_io import StreamingSafetensorsWriter, TensorMeta, TensorSource
from alignflow.errors import ConfigError, ConversionError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Step:
    """A plan mapping oriented for one direction: read `inputs`, run `ops`, write `outputs`."""

    rule: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ops: tuple[Op, ...]
    input_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    dtype: str | None


def steps_to_megatron(plan: Plan) -> list[Step]:
    return [Step(m.rule, m.sources, m.targets, m.ops, m.source_shapes, m.target_shapes, m.dtype)
            for m in plan.mappings]


def steps_to_mindformers(plan: Plan) -> list[Step]:
    return [Step(m.rule, m.targets, m.sources, inverse_chain(m.ops), m.target_shapes, m.source_shapes, m.dtype)
            for m in plan.mappings]


def check_source(steps: list[Step], tensors: Mapping[str, TensorMeta], *, side: str,
                 dropped_on_purpose: Callable[[str], bool],
                 default_dtype: str | None = None) -> tuple[list[str], list[str]]:
    """Every problem of `tensors` against `steps` (missing, mis-shaped, wrong dtype, unused), and the keys
    dropped on purpose. Nothing is read: headers only.

    `default_dtype`: the dtype every input must have where its rule names none (the bf16 checkpoint that
    `convert_to_megatron` reads is bf16 throughout, except what a rule keeps in fp32): an fp16 or int32 tensor
    there would otherwise pass straight into a mixed-dtype Megatron checkpoint (issue 16)."""
    problems: list[str] = []
    consumed: set[str] = set()
    for step in steps:
        dtypes = set()
        for key, shape in zip(step.inputs, step.input_shapes, strict=True):
            consumed.add(key)
            meta = tensors.get(key)
            if meta is None:
                problems.append(f"missing {side} key {key!r} {list(shape)} (for {_names(step.outputs)}; "
                                f"rule {step.rule})")
                continue
            dtypes.add(meta.dtype)
            if meta.shape != shape:
                problems.append(f"wrong shape {key!r}: the checkpoint has {list(meta.shape)}, the spec expects "
                                f"{list(shape)} for this model (rule {step.rule})")
            required = step.dtype or default_dtype
            if required is not None and meta.dtype != DTYPES[required]:
                why = "the spec requires" if step.dtype else "a bf16 checkpoint has"
                problems.append(f"wrong dtype {key!r}: {_dtype(meta.dtype)}, {why} {required} (rule {step.rule})")
        if len(dtypes) > 1:
            problems.append(f"mixed dtypes {sorted(_dtype(d) for d in dtypes)} in {_names(step.inputs)} "
                            f"(rule {step.rule}); concatenating them would silently promote")
    dropped: list[str] = []
    for key in sorted(set(tensors) - consumed, key=natural_key):
        if dropped_on_purpose(key):
            dropped.append(key)
        else:
            problems.append(f"unused {side} key {key!r} {list(tensors[key].shape)}: no rule consumes it; map it "
                            "or add it to the spec's ignore list")
    return problems, dropped


def _names(keys: tuple[str, ...]) -> str:
    return repr(keys[0]) if len(keys) == 1 else f"{keys[0]!r} and {len(keys) - 1} more"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _chain_dtype(ops: tuple[Op, ...], dtype: torch.dtype) -> torch.dtype:
    for op in ops:
        if isinstance(op, Cast):
            dtype = DTYPES[op.target]
    return dtype


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its bytes: `torch.save` writes a view's whole storage (a per-expert slice
    would carry every expert with it)."""
    t = t.contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def _plan(spec: str | Spec, model: ModelConfig | None, flavor: Flavor, megatron_version: str) -> tuple[Spec, Plan]:
    spec_obj = load_spec(spec) if isinstance(spec, str) else spec
    try:
        return spec_obj, build_plan(spec_obj, model, flavor=flavor, megatron_version=megatron_version)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _ignored(plan: Plan) -> Callable[[str], bool]:
    return lambda key: drop_reason(key) is not None or any(fnmatch.fnmatchcase(key, g) for g in plan.ignore)


def _run(steps: list[Step], source: TensorSource, emit: Callable[[str, torch.Tensor], None],
         progress: ProgressFn | None) -> None:
    total = sum(source.tensors[k].nbytes for s in steps for k in s.inputs)
    done = 0
    for step in steps:
        ys = apply_chain(step.ops, [source.read(k) for k in step.inputs])
        for key, y, shape in zip(step.outputs, ys, step.output_shapes, strict=True):
            assert tuple(y.shape) == shape, f"{key}: op chain produced {list(y.shape)}, planned {list(shape)}"
            emit(key, y)
        done += sum(source.tensors[k].nbytes for k in step.inputs)
        if progress is not None:
            progress(done, total)


class RuleProducer:
    """The Megatron tensors of a plan, one rule's outputs at a time (a `TensorProducer` of `torch_dist` and
    `megatron_shards`): read the rule's inputs from the source, run its op chain, cast to the planned dtype."""

    def __init__(self, steps: list[Step], source: TensorSource, dtypes: Mapping[str, torch.dtype]) -> None:
        self._steps, self._source, self._dtypes = steps, source, dtypes
        self.groups: list[tuple[str, ...]] = [s.outputs for s in steps]

    def produce(self, index: int) -> dict[str, torch.Tensor]:
        step = self._steps[index]
        ys = apply_chain(step.ops, [self._source.read(k) for k in step.inputs])
        out = {}
        for key, y, shape in zip(step.outputs, ys, step.output_shapes, strict=True):
            assert tuple(y.shape) == shape, f"{key}: op chain produced {list(y.shape)}, planned {list(shape)}"
            out[key] = _compact(y.to(self._dtypes[key]))
        return out


def _output_dtypes(steps: list[Step], tensors: Mapping[str, TensorMeta]) -> dict[str, torch.dtype]:
    return {key: _chain_dtype(step.ops, tensors[step.inputs[0]].dtype) for step in steps for key in step.outputs}


def convert_to_megatron(src: Path, dst: Path, *, spec: str | Spec, model: ModelConfig | None = None,
                        flavor: Flavor = "local", megatron_version: str = "0.16", iteration: int = 1,
                        progress: ProgressFn | None = None, skeleton: Path | None = None,
                        ckpt_format: CkptFormat = "torch", parallel: ParallelConfig | None = None,
                        workers: int | None = None, source_dtype: str | None = "bfloat16") -> ConversionSummary:
    """Convert the MindFormers checkpoint `src` (normally the bf16 one) into a Megatron checkpoint `dst`.

    `model` gives the shapes to expect (default: the spec's model); `flavor` picks local or Transformer-Engine
    names; `megatron_version` names the MTP inner layer. `skeleton`, a legacy checkpoint that Megatron itself
    saved for the target model, makes its key set, shapes, dtypes and `_extra_state` entries the contract
    (docs/megatron.md#target-key-set-from-megatron-itself) instead of the spec's own list. `source_dtype`: the dtype
    every source tensor has where its rule names none (the bf16 export's; None: any, one per rule). Raises
    `ConversionError` listing every problem; then nothing is written.

    `ckpt_format="torch_dist"` writes Megatron's distributed checkpoint (loads at any TP / PP / EP;
    `alignflow.convert.torch_dist`), `"torch"` with a `parallel` layout beyond 1 x 1 x 1 one legacy file per
    (tp, pp, ep) rank (`alignflow.convert.megatron_shards`); both take names, shapes and sharding from megatron-core's
    own `GPTModel`, and `workers` processes write torch_dist's files (default: one per core).
    """
    if ckpt_format == "torch_dist" or (parallel is not None and (parallel.tp, parallel.pp, parallel.ep) != (1, 1, 1)):
        if skeleton is not None:
            raise ConfigError("--skeleton applies to a single-file legacy checkpoint; a distributed layout takes its "
                              "key set from megatron-core's own GPTModel")
        return _convert_distributed(Path(src), Path(dst), spec=spec, model=model, flavor=flavor,
                                    megatron_version=megatron_version, iteration=iteration, progress=progress,
                                    ckpt_format=ckpt_format, parallel=parallel or ParallelConfig(), workers=workers,
                                    source_dtype=source_dtype)
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    spec_obj, plan = _plan(spec, model, flavor, megatron_version)
    steps = steps_to_megatron(plan)
    header = f"conversion of {src} to Megatron with spec {spec_obj.name} ({flavor}) failed"
    with open_mindformers(src) as ckpt:
        problems, dropped = check_source(steps, ckpt.tensors, side="MindFormers", dropped_on_purpose=_ignored(plan),
                                         default_dtype=source_dtype)
        extra: dict[str, torch.Tensor | None] = dict.fromkeys(plan.extra_state)
        dtypes: dict[str, torch.dtype] = {}
        notes: list[str] = []
        if skeleton is not None:
            extra, dtypes, skel_problems, notes = _skeleton_contract(Path(skeleton), plan)
            problems += skel_problems
        if plan.problems or problems:
            raise ConversionError([*plan.problems, *problems], header=header)
        state: dict[str, torch.Tensor | None] = {}

        def emit(key: str, y: torch.Tensor) -> None:
            state[key] = _compact(y.to(dtypes[key]) if key in dtypes else y)

        _run(steps, ckpt, emit, progress)
        state |= extra
        with staged_output(dst, purpose="convert megatron") as tmp:
            files = write_megatron(tmp, state, iteration)
        dropped = sorted([*dropped, *ckpt.optimizer_keys], key=natural_key)
    tensors = [v for v in state.values() if v is not None]
    log.info("megatron: %d tensors -> %s (%s, mcore %s)", len(tensors), dst, flavor, megatron_version)
    return ConversionSummary(
        kind="megatron", source=str(src), destination=str(dst), iteration=iteration, tensors=len(plan.targets),
        bytes=sum(v.numel() * v.element_size() for k, v in state.items() if v is not None and k not in extra),
        seconds=round(time.perf_counter() - start, 3), output_files=tuple(files), dropped=tuple(dropped),
        dtypes=dtype_counts([_dtype(t.dtype) for k in plan.targets if (t := state[k]) is not None]),
        spec=spec_obj.name, flavor=flavor, megatron_version=megatron_version, extra_state_keys=len(extra),
        notes=tuple(notes),
    )


def _convert_distributed(src: Path, dst: Path, *, spec: str | Spec, model: ModelConfig | None, flavor: Flavor,
                         megatron_version: str, iteration: int, progress: ProgressFn | None, ckpt_format: CkptFormat,
                         parallel: ParallelConfig, workers: int | None,
                         source_dtype: str | None = "bfloat16") -> ConversionSummary:
    """torch_dist, or legacy files of many ranks: planned with the installed megatron-core's names (local spec)."""
    from alignflow.convert.mcore import megatron_core_version
    from alignflow.convert.megatron_shards import write_shards
    from alignflow.convert.sharding import plan_layouts
    from alignflow.convert.torch_dist import write_torch_dist

    start = time.perf_counter()
    installed = ".".join(megatron_core_version().split(".")[:2])
    notes: list[str] = []
    if ckpt_format == "torch_dist":
        if flavor != "local":
            notes.append("torch_dist is flavour-independent: local norms are stored under their Transformer-Engine "
                         "names, and a TE model loads it as it is")
    elif flavor != "local":
        raise ConfigError(f"legacy checkpoints of several ranks are written for the local spec only (flavor "
                          f"{flavor!r}); use --ckpt-format torch_dist, which any spec loads")
    spec_obj, plan = _plan(spec, model, "local", installed)
    model_cfg = model if model is not None else spec_obj.model
    steps = steps_to_megatron(plan)
    layout_name = ("torch_dist" if ckpt_format == "torch_dist" else
                   f"torch tp {parallel.tp} pp {parallel.pp} ep {parallel.ep}")
    header = f"conversion of {src} to Megatron {layout_name} with spec {spec_obj.name} failed"
    with open_mindformers(src) as ckpt:
        problems, dropped = check_source(steps, ckpt.tensors, side="MindFormers", dropped_on_purpose=_ignored(plan),
                                         default_dtype=source_dtype)
        if plan.problems or problems:
            raise ConversionError([*plan.problems, *problems], header=header)
        dtypes = _output_dtypes(steps, ckpt.tensors)
        producer = RuleProducer(steps, ckpt, dtypes)
        with staged_output(dst, purpose="convert megatron") as tmp:
            if ckpt_format == "torch_dist":
                files, _ = write_torch_dist(tmp, model_cfg, producer, iteration=iteration, dtypes=dtypes,
                                            workers=workers, progress=progress)
            else:
                tp1 = plan_layouts(model_cfg).ranks[0]
                _check_layout_names(tp1.names(), plan, header)
                layouts = plan_layouts(model_cfg, parallel)
                files = write_shards(tmp, layouts, tp1, producer, iteration=iteration,
                                     layout_inner=mtp_inner_layer(installed),
                                     file_inner=mtp_inner_layer(megatron_version), progress=progress)
        dropped = sorted([*dropped, *ckpt.optimizer_keys], key=natural_key)
    metas = [TensorMeta(s, dtypes[k]) for m in plan.mappings for k, s in zip(m.targets, m.target_shapes, strict=True)]
    log.info("megatron %s: %d tensors -> %s (mcore %s)", layout_name, len(metas), dst, installed)
    return ConversionSummary(
        kind="megatron", source=str(src), destination=str(dst), iteration=iteration, tensors=len(plan.targets),
        bytes=sum(m.nbytes for m in metas), seconds=round(time.perf_counter() - start, 3),
        output_files=tuple(files), dropped=tuple(dropped), dtypes=dtype_counts([_dtype(m.dtype) for m in metas]),
        spec=spec_obj.name, flavor=flavor, megatron_version=megatron_version if ckpt_format == "torch" else installed,
        extra_state_keys=len(plan.extra_state), notes=tuple(notes), ckpt_format=ckpt_format,
        parallel=(("tp", parallel.tp), ("pp", parallel.pp), ("ep", parallel.ep)),
    )


def _check_layout_names(names: list[str], plan: Plan, header: str) -> None:
    mine, made = set(names), set(plan.targets)
    problems = [f"megatron-core's GPTModel has no tensor {n!r} (the spec writes it)" for n in plan.targets
                if n not in mine]
    problems += [f"megatron-core's GPTModel has {n!r}, which no rule of the spec writes" for n in names
                 if n not in made]
    if problems:
        raise ConversionError(problems, header=header)


def _skeleton_contract(path: Path, plan: Plan) -> tuple[dict[str, torch.Tensor | None], dict[str, torch.dtype],
                                                        list[str], list[str]]:
    """Compare the plan's targets with a Megatron-saved skeleton; take `_extra_state` entries and dtypes from it."""
    with open_megatron(path) as skel:
        problems: list[str] = []
        extra: dict[str, torch.Tensor | None] = {}
        weights: dict[str, TensorMeta] = {}
        for key, meta in skel.tensors.items():
            if key.endswith("._extra_state"):
                extra[key] = skel.read(key).clone()
            else:
                weights[key] = meta
        extra |= {k: v for k, v in skel.others.items() if k.endswith("._extra_state") and v is None}
        planned = plan.target_shapes()
        for key in sorted(set(weights) - set(planned), key=natural_key):
            problems.append(f"skeleton key {key!r} {list(weights[key].shape)} is produced by no rule")
        for key in sorted(set(planned) - set(weights), key=natural_key):
            problems.append(f"target key {key!r} is not in the skeleton (the target model has no such parameter)")
        for key in sorted(set(planned) & set(weights), key=natural_key):
            if planned[key] != weights[key].shape:
                problems.append(f"target key {key!r}: the spec makes {list(planned[key])}, the skeleton has "
                                f"{list(weights[key].shape)}")
        notes = []
        if set(extra) != set(plan.extra_state):
            notes.append(f"_extra_state keys taken from the skeleton ({len(extra)}), the spec lists "
                         f"{len(plan.extra_state)}")
        return extra, {k: m.dtype for k, m in weights.items()}, problems, notes


def convert_to_mindformers(src: Path, dst: Path, *, spec: str | Spec, model: ModelConfig | None = None,
                           flavor: Flavor = "local", megatron_version: str = "0.16", iteration: int | None = None,
                           prefix: str = DEFAULT_PREFIX, progress: ProgressFn | None = None) -> ConversionSummary:
    """Convert a Megatron checkpoint back into the MindFormers bf16 layout (the inverse op chains).

    The source is a single legacy file, legacy files of many ranks (`mp_rank_TT[_PPP][_EEE]`, their TP / PP / EP read
    from the names) or torch_dist, detected as Megatron-LM detects them; a distributed source is read through
    megatron-core's own layout of `model` (its names, in the installed megatron-core's naming, and shapes).
    `_extra_state` entries are dropped (listed); every other Megatron key must be mapped. The iteration defaults
    to the Megatron checkpoint's. Same fail-closed contract as `convert_to_megatron`.
    """
    from alignflow.convert.megatron_read import detect, open_distributed

    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    fmt = detect(src)
    notes_in: list[str] = []
    if not fmt.single_file:
        from alignflow.convert.mcore import megatron_core_version

        megatron_version = ".".join(megatron_core_version().split(".")[:2])
        if flavor != "local":
            notes_in.append(f"{fmt.ckpt_format} read through the local spec's names (flavour {flavor} ignored)")
        flavor = "local"
    spec_obj, plan = _plan(spec, model, flavor, megatron_version)
    steps = steps_to_mindformers(plan)
    header = f"conversion of {src} to MindFormers with spec {spec_obj.name} ({flavor}) failed"
    opened = (open_megatron(src) if fmt.single_file else
              open_distributed(src, fmt, model if model is not None else spec_obj.model))
    with opened as mg:
        problems, dropped = check_source(steps, mg.tensors, side="Megatron",
                                         dropped_on_purpose=lambda k: k.endswith("._extra_state"))
        problems += _others_problems(mg)
        dropped = sorted([*dropped, *(k for k in mg.others if k.endswith("._extra_state"))], key=natural_key)
        if plan.problems or problems:
            raise ConversionError([*plan.problems, *problems], header=header)
        it = mg.iteration if iteration is None else iteration
        layout = [(key, TensorMeta(shape, _chain_dtype(step.ops, mg.tensors[step.inputs[0]].dtype)))
                  for step in steps for key, shape in zip(step.outputs, step.output_shapes, strict=True)]
        file_name = model_file_name(prefix)
        with staged_output(dst, purpose="convert mindformers") as tmp:
            out_dir = tmp / iteration_dir_name(it)
            out_dir.mkdir()
            metadata = {"format": "pt", "producer": "alignflow convert mindformers"}
            with StreamingSafetensorsWriter(out_dir / file_name, layout, metadata) as writer:
                _run(steps, mg, writer.write, progress)
            common, notes = common_json(None, it)
            (out_dir / COMMON_JSON).write_text(json.dumps(common, indent=4), encoding="utf-8")
            (tmp / TRACKER).write_text(str(it), encoding="utf-8")
    p = fmt.parallel
    return ConversionSummary(
        kind="mindformers", source=str(src), destination=str(dst), iteration=it, tensors=len(layout),
        bytes=writer.bytes_written, seconds=round(time.perf_counter() - start, 3),
        output_files=(TRACKER, f"{iteration_dir_name(it)}/{COMMON_JSON}", f"{iteration_dir_name(it)}/{file_name}"),
        dropped=tuple(dropped), dtypes=dtype_counts([_dtype(m.dtype) for _, m in layout]), spec=spec_obj.name,
        flavor=flavor, megatron_version=megatron_version, notes=(*notes_in, *notes),
        ckpt_format=None if fmt.single_file else fmt.ckpt_format,
        parallel=() if fmt.single_file else (("tp", p.tp), ("pp", p.pp), ("ep", p.ep)),
    )


def _others_problems(mg: Any) -> list[str]:
    return [f"unused Megatron key {k!r}: a {type(v).__name__}, not a tensor" for k, v in mg.others.items()
            if not k.endswith("._extra_state")]
