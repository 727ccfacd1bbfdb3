"""Checkpoint formats, each read and written by its own library, and the conversion between any two of them.

| format        | library                                   | names (`alignflow.pipeline.NAMING`)            |
|---------------|-------------------------------------------|------------------------------------------------|
| `mindformers` | safetensors, `common.json`, tracker       | MindFormers PyNative (`decoder.layers.{i}.`)   |
| `megatron`    | `torch.save` / `torch.load(weights_only)` | megatron-core GPTModel (legacy `iter_*/mp_rank_00`) |
| `torch_dist`  | megatron-core `dist_checkpointing`        | megatron-core GPTModel                         |
| `hf`          | safetensors + transformers' config class  | Hugging Face (`model.layers.{i}.`)             |
| `dcp`         | `torch.distributed.checkpoint`            | Hugging Face (a model state dict)              |

Every conversion spec maps one family's names onto Megatron's (`<family>` from MindFormers', `<family>-hf` from
Hugging Face's), so Megatron's names are the pivot: a conversion runs the source spec's rules into Megatron's names
and the target spec's inverse out of them, a source or target in Megatron's names skipping its half. Two formats
with the same names only change container: every tensor is copied as is. It is fail-closed like the two-format
converters it generalises (`alignflow.convert.engine`: they still do MindFormers <-> Megatron legacy and torch_dist,
with the bf16 rule and the skeleton contract): every problem of the source's headers against both halves is listed
before a byte is written, the output is staged and renamed into place last, and tensors stream one rule at a time (a
rule's other outputs wait until read: an expert stack is read once).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from alignflow.config.model import ModelConfig
from alignflow.convert.bf16 import drop_reason
from alignflow.convert.engine import (
    Step,
    _chain_dtype,
    _compact,
    _dtype,
    check_source,
    convert_to_megatron,
    convert_to_mindformers,
    steps_to_megatron,
    steps_to_mindformers,
)
from alignflow.convert.hf import CONFIG_JSON, config_json, read_config
from alignflow.convert.layout import COMMON_JSON, TRACKER, iteration_dir_name, model_file_name
from alignflow.convert.megatron import open_megatron, write_megatron
from alignflow.convert.mindformers import DEFAULT_PREFIX, common_json, open_mindformers
from alignflow.convert.ops import DTYPES, apply_chain
from alignflow.convert.plan import Plan, build_plan, natural_key
from alignflow.convert.registry import load_spec
from alignflow.convert.spec import Flavor, Spec
from alignflow.convert.summary import ConversionSummary, ProgressFn, dtype_counts, staged_output
from alignflow.convert.tensor_io import StreamingSafetensorsWriter, TensorMeta, TensorSource, read_layout, read_tensor
from alignflow.convert.unreadable import reading, storage_problems
from alignflow.errors import ConfigError, ConversionError
from alignflow.pipeline import CHECKPOINT_FORMATS, NAMING, CheckpointFormat, Naming, not_converted

log = logging.getLogger(__name__)
HF_MODEL_FILE = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"


class HfCheckpoint:
    """A Hugging Face `save_pretrained` directory (or one safetensors file) opened for reading, tensor by tensor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors: dict[str, TensorMeta] = {}
        self._file: dict[str, Path] = {}
        header = f"cannot open the Hugging Face checkpoint {path}"
        directory = path if path.is_dir() else path.parent
        files = [path] if path.is_file() else self._files(path, header)
        for f in files:
            if not f.is_file():
                raise ConversionError([f"{f}: missing (named by {HF_INDEX})"], header=header)
            with reading(f, header=header):
                layout = read_layout(f)
            for name, meta in layout.items():
                if name in self.tensors:
                    raise ConversionError([f"{name} is in both {self._file[name].name} and {f.name}"], header=header)
                self.tensors[name], self._file[name] = meta, f
        with reading(directory / CONFIG_JSON, header=header):
            self.config = read_config(directory)
        problems = config_problems(self.config, self.tensors, config_file=directory / CONFIG_JSON, files=files)
        if problems:
            raise ConversionError(problems, header=header)

    @staticmethod
    def _files(path: Path, header: str) -> list[Path]:
        index = path / HF_INDEX
        if index.is_file():
            with reading(index, header=header):
                doc = json.loads(index.read_text(encoding="utf-8"))
            weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise ConversionError([f"{index}: no weight_map"], header=header)
            return [path / str(name) for name in sorted(set(weight_map.values()))]
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ConversionError([f"{path}: no {HF_MODEL_FILE}, {HF_INDEX} or *.safetensors"], header=header)
        return files

    def read(self, name: str) -> torch.Tensor:
        with reading(self._file[name], header=f"cannot read the Hugging Face checkpoint {self.path}"):
            return read_tensor(self._file[name], name)

    def close(self) -> None:
        return None


# config.json's dimensions and the tensor that shows each (`model.layers.{i}.` counts the layers)
_HF_DIMENSIONS = (("hidden_size", "model.embed_tokens.weight", 1), ("vocab_size", "model.embed_tokens.weight", 0),
                  ("intermediate_size", "model.layers.0.mlp.gate_proj.weight", 0))


def config_problems(config: dict[str, Any] | None, tensors: dict[str, TensorMeta], *, config_file: Path,
                    files: list[Path]) -> list[str]:
    """Where a Hugging Face checkpoint's config.json contradicts its tensors (issue 45: a config claiming twice the
    layers and width converted without a word; the config is what a loader builds the model from)."""
    if config is None:
        return []
    where = ", ".join(f.name for f in files)
    problems = []
    layers = {int(k.split(".")[2]) for k in tensors if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    claimed = config.get("num_hidden_layers")
    if isinstance(claimed, int) and layers and claimed != len(layers):
        problems.append(f"{config_file}: num_hidden_layers {claimed}, but the tensors of {where} hold {len(layers)} "
                        f"layers (model.layers.0-{max(layers)})")
    for key, tensor, dim in _HF_DIMENSIONS:
        claimed = config.get(key)
        meta = tensors.get(tensor)
        if isinstance(claimed, int) and meta is not None and len(meta.shape) > dim and meta.shape[dim] != claimed:
            problems.append(f"{config_file}: {key} {claimed}, but {tensor} in {where} has shape {list(meta.shape)}")
    return problems


class DcpCheckpoint:
    """A `torch.distributed.checkpoint` directory opened for reading: the metadata up front, each tensor through
    `torch.distributed.checkpoint.load` of a one-entry state dict (no process group: one process reads it)."""

    def __init__(self, path: Path) -> None:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.path = path
        header = f"cannot open the DCP checkpoint {path}"
        if not (path / ".metadata").is_file():
            raise ConversionError([f"{path / '.metadata'}: missing"], header=header)
        with reading(path / ".metadata", header=header):
            metadata = FileSystemReader(str(path)).read_metadata()
        problems = storage_problems(path, metadata)
        if problems:
            raise ConversionError(problems, header=header)
        self.tensors: dict[str, TensorMeta] = {}
        self.others: list[str] = []
        self._files: dict[str, list[str]] = {}  # the .distcp files of each tensor (what a failed read names)
        for index, info in metadata.storage_data.items():
            self._files.setdefault(index.fqn, []).append(str(info.relative_path))
        for name, meta in metadata.state_dict_metadata.items():
            if isinstance(meta, TensorStorageMetadata):
                self.tensors[name] = TensorMeta(tuple(meta.size), meta.properties.dtype)
            else:
                self.others.append(name)

    def read(self, name: str) -> torch.Tensor:
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.state_dict_loader import load

        meta = self.tensors[name]
        state = {name: torch.empty(meta.shape, dtype=meta.dtype)}
        files = ", ".join(str(self.path / f) for f in sorted(set(self._files.get(name, ())))) or str(self.path)
        with reading(files, header=f"cannot read tensor {name!r} of the DCP checkpoint {self.path}",
                     also=(CheckpointException,)), _single_process():
            load(state, storage_reader=FileSystemReader(str(self.path)), no_dist=True)
        return state[name]

    def close(self) -> None:
        return None


@contextmanager
def open_checkpoint(fmt: CheckpointFormat, path: Path) -> Iterator[TensorSource]:
    """The checkpoint `path` of format `fmt`, opened for reading through its own library."""
    path = Path(path)
    if not path.exists():
        raise ConversionError([f"{path}: no such file or directory"], header=f"cannot open the {fmt} checkpoint")
    if fmt == "mindformers":
        with open_mindformers(path) as mf:
            yield mf
    elif fmt == "megatron":
        with open_megatron(path) as mg:
            yield mg
    elif fmt == "hf":
        yield HfCheckpoint(path)
    elif fmt == "dcp":
        yield DcpCheckpoint(path)
    else:
        raise ConfigError(f"{fmt} is read by its own converter (`alignflow convert mindformers --from {fmt}`), not "
                          "opened as a tensor source")


@contextmanager
def _single_process() -> Iterator[None]:
    """DCP warns on every save and load without a process group that it assumes one process: which is the case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


class _Converted:
    """`source`'s tensors after `steps`, read lazily: what a second half of a conversion reads from."""

    def __init__(self, source: TensorSource, steps: list[Step]) -> None:
        self.source = source
        self._producer = {key: step for step in steps for key in step.outputs}
        # a source key that is missing has its problem listed already; nothing is read or written then
        self.tensors = {key: TensorMeta(shape, _chain_dtype(step.ops, source.tensors[step.inputs[0]].dtype
                                                            if step.inputs[0] in source.tensors else torch.float32))
                        for step in steps for key, shape in zip(step.outputs, step.output_shapes, strict=True)}
        self._waiting: dict[str, torch.Tensor] = {}

    def read(self, name: str) -> torch.Tensor:
        if name in self._waiting:
            return self._waiting.pop(name)
        step = self._producer[name]
        ys = apply_chain(step.ops, [self.source.read(k) for k in step.inputs])
        out = dict(zip(step.outputs, ys, strict=True))
        self._waiting.update({k: v for k, v in out.items() if k != name})
        return out[name]

    def close(self) -> None:
        self._waiting.clear()


def _identity(tensors: dict[str, TensorMeta]) -> list[Step]:
    return [Step("same names", (k,), (k,), (), (m.shape,), (m.shape,), None) for k, m in
            sorted(tensors.items(), key=lambda kv: natural_key(kv[0]))]


def spec_for(naming: Naming, spec: str | Spec) -> Spec:
    """The family's spec whose sources carry `naming` (MindFormers': the spec itself; Hugging Face's: `<spec>-hf`,
    or `<stem>-hf.yaml` beside a spec file)."""
    base = load_spec(spec) if isinstance(spec, str) else spec
    if naming == "mindformers" or base.source_layout == naming:
        return base
    if isinstance(spec, str) and spec.endswith((".yaml", ".yml")):
        sibling = Path(spec).with_name(f"{Path(spec).stem}-hf.yaml")
        return load_spec(str(sibling)) if sibling.is_file() else load_spec(f"{base.name}-hf")
    return load_spec(f"{base.name}-hf")


def _plan(spec: Spec, model: ModelConfig | None, flavor: Flavor, megatron_version: str) -> Plan:
    try:
        return build_plan(spec, model, flavor=flavor, megatron_version=megatron_version)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def convert_checkpoint(src: Path, dst: Path, *, source: CheckpointFormat, target: CheckpointFormat,
                       spec: str | Spec | None = None, model: ModelConfig | None = None, flavor: Flavor = "local",
                       megatron_version: str = "0.16", iteration: int = 1, source_dtype: str | None = None,
                       progress: ProgressFn | None = None) -> ConversionSummary:
    """Convert the checkpoint `src` of format `source` into `dst` of format `target` (see the module docstring).

    `spec` names the model family (its MindFormers spec; the Hugging Face one is found from it), `model` its
    dimensions; `source_dtype` (`bfloat16`) refuses a source tensor of another dtype where no rule names one (a
    bf16 export). Raises `ConversionError` listing every problem; then nothing is written.
    """
    source_dtype = None if source_dtype == "any" else source_dtype
    if source_dtype is not None and source_dtype not in DTYPES:
        raise ConfigError(f"--source-dtype {source_dtype!r}: one of any, {', '.join(DTYPES)}")
    for fmt in (source, target):
        if fmt not in CHECKPOINT_FORMATS:
            raise ConfigError(f"unknown checkpoint format {fmt!r}; formats: {', '.join(CHECKPOINT_FORMATS)}")
    if "torch_dist" in (source, target) and source != target:
        if spec is None:
            raise ConfigError(f"converting {source} to {target} needs the model family's conversion spec (--spec)")
        if (source, target) == ("mindformers", "torch_dist"):
            return convert_to_megatron(src, dst, spec=spec, model=model, flavor=flavor,
                                       megatron_version=megatron_version, iteration=iteration, progress=progress,
                                       source_dtype=source_dtype, ckpt_format="torch_dist")
        if (source, target) == ("torch_dist", "mindformers"):
            return convert_to_mindformers(src, dst, spec=spec, model=model, flavor=flavor,
                                          megatron_version=megatron_version, iteration=iteration, progress=progress)
        raise ConfigError(f"{source} -> {target}: {not_converted(source, target)}")
    if (source, target) == ("mindformers", "megatron") and spec is not None:
        return convert_to_megatron(src, dst, spec=spec, model=model, flavor=flavor, megatron_version=megatron_version,
                                   iteration=iteration, progress=progress, source_dtype=source_dtype)
    if (source, target) == ("megatron", "mindformers") and spec is not None:
        return convert_to_mindformers(src, dst, spec=spec, model=model, flavor=flavor,
                                      megatron_version=megatron_version, iteration=iteration, progress=progress)
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    src_names, dst_names = NAMING[source], NAMING[target]
    header = f"conversion of {src} ({source}) to {target} failed"
    plans: dict[str, Plan] = {}
    if src_names != dst_names:
        if spec is None:
            raise ConfigError(f"converting {source} ({src_names} names) to {target} ({dst_names} names) needs the "
                              "model family's conversion spec (--spec)")
        for naming in {src_names, dst_names} - {"megatron"}:
            plans[naming] = _plan(spec_for(naming, spec), model, flavor, megatron_version)
    with open_checkpoint(source, src) as ckpt:
        problems: list[str] = []
        dropped: list[str] = []
        if src_names == dst_names:
            first = _identity(dict(ckpt.tensors))
        else:
            first, problems, dropped = _first_half(ckpt, src_names, plans, source_dtype)
        view = _Converted(ckpt, first)
        if src_names != dst_names and dst_names != "megatron":
            second = steps_to_mindformers(plans[dst_names])
            more, _ = check_source(second, view.tensors, side="Megatron (converted)",
                                   dropped_on_purpose=lambda k: False)
            problems += [f"{p} (the {dst_names} spec and the {src_names} spec disagree)" for p in more]
            final: TensorSource = _Converted(view, second)
        else:
            final = view
        plan_problems = [p for plan in plans.values() for p in plan.problems]
        if plan_problems or problems:
            raise ConversionError([*plan_problems, *problems], header=header)
        with staged_output(dst) as tmp:
            files, written = _write(target, tmp, final, iteration=iteration, model=model,
                                    hf_config=getattr(ckpt, "config", None), progress=progress)
        dropped = sorted({*dropped, *getattr(ckpt, "optimizer_keys", ())}, key=natural_key)
    log.info("%s -> %s: %d tensors -> %s", source, target, len(written), dst)
    return ConversionSummary(
        kind=target, source=str(src), destination=str(dst), iteration=iteration, tensors=len(written),
        bytes=sum(m.nbytes for m in written.values()), seconds=round(time.perf_counter() - start, 3),
        output_files=tuple(files), dropped=tuple(dropped),
        dtypes=dtype_counts([_dtype(m.dtype) for m in written.values()]),
        spec=next(iter(plans.values())).spec if plans else None, flavor=flavor, megatron_version=megatron_version,
        notes=(f"{source} -> {target} through Megatron's names",) if len(plans) == 2 else ())


def _first_half(ckpt: TensorSource, names: Naming, plans: dict[str, Plan], source_dtype: str | None
                ) -> tuple[list[Step], list[str], list[str]]:
    """The steps into Megatron's names, the problems of the source's headers against them, the keys dropped."""
    if names == "megatron":  # a Megatron source: every key of the target's plan, `_extra_state` dropped
        plan = next(iter(plans.values()))
        steps = [Step(m.rule, m.targets, m.targets, (), m.target_shapes, m.target_shapes, m.dtype)
                 for m in plan.mappings]
        problems, dropped = check_source(steps, ckpt.tensors, side="Megatron",
                                         dropped_on_purpose=lambda k: k.endswith("._extra_state"))
        return steps, problems, dropped
    plan = plans[names]
    steps = steps_to_megatron(plan)
    side = "MindFormers" if names == "mindformers" else "Hugging Face"

    def ignored(key: str) -> bool:
        return (names == "mindformers" and drop_reason(key) is not None) or any(
            fnmatch.fnmatchcase(key, g) for g in plan.ignore)

    problems, dropped = check_source(steps, ckpt.tensors, side=side, dropped_on_purpose=ignored,
                                     default_dtype=source_dtype)
    return steps, problems, dropped


def _write(target: CheckpointFormat, tmp: Path, source: TensorSource, *, iteration: int, model: ModelConfig | None,
           hf_config: dict[str, Any] | None, progress: ProgressFn | None) -> tuple[list[str], dict[str, TensorMeta]]:
    """Write every tensor of `source` into the staged directory `tmp` in `target`'s layout; (files, tensors)."""
    names = sorted(source.tensors, key=natural_key)
    layout = [(k, source.tensors[k]) for k in names]
    total = sum(m.nbytes for _, m in layout)
    done = 0

    def stream(writer: StreamingSafetensorsWriter) -> None:
        nonlocal done
        for key, meta in layout:
            writer.write(key, source.read(key))
            done += meta.nbytes
            if progress is not None:
                progress(done, total)

    if target == "mindformers":
        out_dir = tmp / iteration_dir_name(iteration)
        out_dir.mkdir()
        file_name = model_file_name(DEFAULT_PREFIX)
        with StreamingSafetensorsWriter(out_dir / file_name, layout,
                                        {"format": "pt", "producer": "alignflow convert mindformers"}) as writer:
            stream(writer)
        common, _ = common_json(None, iteration)
        (out_dir / COMMON_JSON).write_text(json.dumps(common, indent=4), encoding="utf-8")
        (tmp / TRACKER).write_text(str(iteration), encoding="utf-8")
        rel = iteration_dir_name(iteration)
        return [TRACKER, f"{rel}/{COMMON_JSON}", f"{rel}/{file_name}"], dict(layout)
    if target == "hf":
        with StreamingSafetensorsWriter(tmp / HF_MODEL_FILE, layout, {"format": "pt"}) as writer:
            stream(writer)
        if hf_config is not None:
            text = json.dumps(hf_config, indent=2, sort_keys=True) + "\n"
        elif model is not None:
            text = config_json(model)
        else:
            raise ConfigError("a Hugging Face checkpoint needs its config.json: give the model (--model)")
        (tmp / CONFIG_JSON).write_text(text, encoding="utf-8")
        return [CONFIG_JSON, HF_MODEL_FILE], dict(layout)
    state: dict[str, torch.Tensor] = {}
    for key, meta in layout:
        state[key] = _compact(source.read(key))
        done += meta.nbytes
        if progress is not None:
            progress(done, total)
    if target == "megatron":
        files = write_megatron(tmp, dict(state), iteration)
        return files, dict(layout)
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    with _single_process():
        save(state, storage_writer=FileSystemWriter(str(tmp)), no_dist=True)
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()), dict(layout)
