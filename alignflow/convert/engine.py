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

import torch

from alignflow.config.model import ModelConfig
from alignflow.convert.bf16 import drop_reason
from alignflow.convert.layout import COMMON_JSON, TRACKER, iteration_dir_name, model_file_name
from alignflow.convert.megatron import MegatronCheckpoint, open_megatron, write_megatron
from alignflow.convert.mindformers import DEFAULT_PREFIX, common_json, open_mindformers
from alignflow.convert.ops import DTYPES, Cast, Op, Shape, apply_chain, inverse_chain
from alignflow.convert.plan import Plan, build_plan, natural_key
from alignflow.convert.registry import load_spec
from alignflow.convert.spec import Flavor, Spec
from alignflow.convert.summary import ConversionSummary, ProgressFn, dtype_counts, staged_output
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


def convert_to_megatron(src: Path, dst: Path, *, spec: str | Spec, model: ModelConfig | None = None,
                        flavor: Flavor = "local", megatron_version: str = "0.16", iteration: int = 1,
                        progress: ProgressFn | None = None, skeleton: Path | None = None) -> ConversionSummary:
    """Convert the MindFormers checkpoint `src` (normally the bf16 one) into a Megatron legacy checkpoint `dst`.

    `model` gives the shapes to expect (default: the spec's model); `flavor` picks local or Transformer-Engine
    names; `megatron_version` names the MTP inner layer. `skeleton`, a legacy checkpoint that Megatron itself
    saved for the target model, makes its key set, shapes, dtypes and `_extra_state` entries the contract
    (docs/megatron.md#target-key-set-from-megatron-itself) instead of the spec's own list. Raises `ConversionError`
    listing every problem; then nothing is written.
    """
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    spec_obj, plan = _plan(spec, model, flavor, megatron_version)
    steps = steps_to_megatron(plan)
    header = f"conversion of {src} to Megatron with spec {spec_obj.name} ({flavor}) failed"
    with open_mindformers(src) as ckpt:
        problems, dropped = check_source(steps, ckpt.tensors, side="MindFormers", dropped_on_purpose=_ignored(plan),
                                         default_dtype="bfloat16")
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
    """Convert a Megatron legacy checkpoint back into the MindFormers bf16 layout (the inverse op chains).

    `_extra_state` entries are dropped (listed); every other Megatron key must be mapped. The iteration defaults
    to the Megatron checkpoint's. Same fail-closed contract as `convert_to_megatron`.
    """
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    spec_obj, plan = _plan(spec, model, flavor, megatron_version)
    steps = steps_to_mindformers(plan)
    header = f"conversion of {src} to MindFormers with spec {spec_obj.name} ({flavor}) failed"
    with open_megatron(src) as mg:
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
    return ConversionSummary(
        kind="mindformers", source=str(src), destination=str(dst), iteration=it, tensors=len(layout),
        bytes=writer.bytes_written, seconds=round(time.perf_counter() - start, 3),
        output_files=(TRACKER, f"{iteration_dir_name(it)}/{COMMON_JSON}", f"{iteration_dir_name(it)}/{file_name}"),
        dropped=tuple(dropped), dtypes=dtype_counts([_dtype(m.dtype) for _, m in layout]), spec=spec_obj.name,
        flavor=flavor, megatron_version=megatron_version, notes=tuple(notes),
    )


def _others_problems(mg: MegatronCheckpoint) -> list[str]:
    return [f"unused Megatron key {k!r}: a {type(v).__name__}, not a tensor" for k, v in mg.others.items()
            if not k.endswith("._extra_state")]
