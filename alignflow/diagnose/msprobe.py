"""msprobe (MindStudio Probe, PyPI `mindstudio-probe` 26.2) for the real frameworks: read its dumps, write its
mapping files from the conversion spec, render its config and the lines that switch it on.

Formats, as msprobe 26.2 writes and reads them (`msprobe/core/dump/data_dump/`, `msprobe/core/compare/`):

- a dump: `<dump_path>/step<N>/<rank dir>/dump.json` = `{task, level, framework, dump_data_dir, data}` where
  `data` maps, in execution order, `Module.<name>.<Class>.forward.<n>` (PyTorch) / `Cell.<name>.<Class>.forward.<n>`
  (MindSpore) to `{input_args, input_kwargs, output, parameters}` and `<prefix>.<name>.<Class>.parameters_grad.<n>`
  to `{<param>: [tensor]}`; each tensor `{type, dtype, shape, Max, Min, Mean, Norm[, data_name]}`, `data_name` a
  file of `dump_tensor_data/` (`.pt` / `.npy`) in `task: tensor`; `construct.json` maps each call to its parent.
- `msprobe compare -m auto -tp <npu dump.json> -gp <bench dump.json> -o <dir> -lm layer_mapping.yaml` where the
  layer mapping is `{<NPU class>: {<npu child>: <bench child>}}` (`TopLayer` for the root), or `-dm
  data_mapping.yaml` = `{<npu full op name>: <bench full op name>}` (`....forward.0.input.0`, `.output.0`,
  `.parameters.weight`, `....parameters_grad.0.weight`).

msprobe dumps each parameter as its module runs, so the value after the optimizer update is the next step's
forward value: pass that step's dump as `after` to have updates compared too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from alignflow.diagnose.mapping import DumpMapping
from alignflow.errors import ConfigError
from alignflow.frameworks.dumpfile import Call, Dump, ParamEntry

_CALL = re.compile(r"^(?P<kind>Module|Cell)\.(?P<name>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward)\.(?P<n>\d+)$")
_GRAD = re.compile(r"^(?P<kind>Module|Cell)\.(?P<name>.+)\.(?P<cls>[^.]+)\.parameters_grad(?:\.(?P<n>\d+))?$")
_STATS = ("Max", "Min", "Mean", "Norm")


def find_dump_json(path: str | Path) -> Path:
    """`dump.json` itself, or the only one under a step / rank directory."""
    p = Path(path)
    if p.is_file():
        return p
    found = sorted(p.rglob("dump.json")) if p.is_dir() else []
    if len(found) != 1:
        raise ConfigError(f"{p}: expected one msprobe dump.json (a step<N>/<rank> directory), found {len(found)}")
    return found[0]


def read_msprobe_dump(path: str | Path, *, side: str = "", step: int = 1, strip: str = "",
                      after: str | Path | None = None) -> Dump:
    """An msprobe dump as a `Dump`; `strip` removes a wrapper prefix from module names (Megatron's
    `module.module.`); `after`, the next step's dump, supplies the parameters after the update."""
    json_path = find_dump_json(path)
    meta = _load(json_path)
    framework = str(meta.get("framework", ""))
    data = meta.get("data")
    if not isinstance(data, dict):
        raise ConfigError(f"{json_path}: no `data` mapping; not an msprobe dump.json")
    construct = _load(json_path.parent / "construct.json") if (json_path.parent / "construct.json").is_file() else {}
    tensors = _Tensors(json_path.parent / "dump_tensor_data")
    params: dict[str, ParamEntry] = {}
    calls = _calls(data, construct, strip, tensors, params)
    _grads(data, strip, tensors, params)
    if after is not None:
        _updates(read_msprobe_dump(after, side=side, step=step + 1, strip=strip), tensors, params)
    return Dump(json_path.parent, framework, side, step, tuple(calls), params, {}, {},
                (f"msprobe {meta.get('task')} dump, level {meta.get('level')}",), 0, None, tensors.stats,
                tensors.files)


class _Tensors:
    """The tensors a dump names, by key: their statistics, and their data file where the dump holds it (`task:
    tensor`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, Path] = {}
        self.stats: dict[str, dict[str, float]] = {}

    def keep(self, key: str, item: Any) -> str | None:
        """Record `item` (one tensor of dump.json) under `key`; None when it is no tensor."""
        if not isinstance(item, dict) or "shape" not in item:
            return None
        name = item.get("data_name")
        if isinstance(name, str) and (self.directory / name).is_file():
            self.files[key] = self.directory / name
        self.stats[key] = {k: float(item[k]) for k in _STATS if isinstance(item.get(k), int | float)}
        return key


def _calls(data: dict[str, Any], construct: Any, strip: str, tensors: _Tensors,
           params: dict[str, ParamEntry]) -> list[Call]:
    """The forward calls in the order they started, with their inputs and outputs; a module's first call also
    gives its parameters as loaded."""
    calls: list[Call] = []
    ids: dict[str, int] = {}
    forward = [(op, entry, m) for op, entry in data.items()
               if isinstance(entry, dict) and (m := _CALL.match(op)) and m.group("dir") == "forward"]
    parents = {op: construct.get(op) if isinstance(construct, dict) else None for op, _, _ in forward}
    for op, entry, m in _preorder(forward, parents):
        module = _strip(m.group("name"), strip)
        parent_op = parents.get(op)
        call = Call(len(calls), module, int(m.group("n")), m.group("cls"),
                    ids.get(parent_op) if isinstance(parent_op, str) else None, origin=op)
        call.inputs = [tensors.keep(f"{op}.input.{i}", t) for i, t in enumerate(_flat(entry.get("input_args", [])))]
        call.outputs = [tensors.keep(f"{op}.output.{i}", t) for i, t in enumerate(_flat(entry.get("output", [])))]
        ids[op] = call.id
        calls.append(call)
        if call.index == 0:
            for pname, item in (entry.get("parameters") or {}).items():
                full = f"{module}.{pname}"
                params.setdefault(full, ParamEntry(full, True)).loaded = tensors.keep(f"{op}.parameters.{pname}", item)
    return calls


def _grads(data: dict[str, Any], strip: str, tensors: _Tensors, params: dict[str, ParamEntry]) -> None:
    """Each parameter's gradient (`<prefix>.<name>.<Class>.parameters_grad.<n>`)."""
    for op, entry in data.items():
        g = _GRAD.match(op)
        if g and isinstance(entry, dict):
            module = _strip(g.group("name"), strip)
            for pname, items in entry.items():
                item = items[0] if isinstance(items, list) and items else items
                full = f"{module}.{pname}"
                e = params.setdefault(full, ParamEntry(full, True))
                e.grad, e.origin = tensors.keep(f"{op}.{pname}", item), op


def _updates(later: Dump, tensors: _Tensors, params: dict[str, ParamEntry]) -> None:
    """Each parameter after the update: its value as the next step's dump loaded it (`after:<key>`)."""
    for name, entry in later.params.items():
        if name in params and entry.loaded is not None:
            key = f"after:{entry.loaded}"
            if entry.loaded in later.files:
                tensors.files[key] = later.files[entry.loaded]
            if entry.loaded in later.stats:
                tensors.stats[key] = later.stats[entry.loaded]
            params[name].updated = key


def _preorder(forward: list[Any], parents: dict[str, Any]) -> list[Any]:
    """Calls in the order they started: msprobe writes a module when its forward ends (children before their
    parent); `construct.json` names each call's parent, and a parent starts before its first child."""
    position = {op: i for i, (op, _, _) in enumerate(forward)}
    children: dict[str | None, list[str]] = {}
    for op, _, _ in forward:
        parent = parents.get(op)
        children.setdefault(parent if parent in position else None, []).append(op)
    start: dict[str, int] = {}

    def first(op: str) -> int:
        if op not in start:
            start[op] = min([position[op], *(first(k) for k in children.get(op, []))])
        return start[op]

    by_op = {item[0]: item for item in forward}
    out: list[Any] = []

    def visit(op: str) -> None:
        out.append(by_op[op])
        for kid in sorted(children.get(op, []), key=first):
            visit(kid)

    for root in sorted(children.get(None, []), key=first):
        visit(root)
    return out


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable msprobe file ({exc})") from None


def _flat(items: Any) -> list[Any]:
    if isinstance(items, dict):
        return [items]
    if isinstance(items, list | tuple):
        return [t for x in items for t in _flat(x)]
    return [None]


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix):] if prefix and name.startswith(prefix) else name


# ---------------------------------------------------------------------------------------------- mapping files

def layer_mapping(mapping: DumpMapping, npu: Dump | None = None) -> dict[str, dict[str, str]]:
    """msprobe's layer mapping from the spec's module renames: `{<NPU parent class>: {<child>: <bench child>}}`.

    The parent's class comes from the NPU dump when it ran as a module there; a scope that is no module of its own
    is a node named after itself in msprobe's layer tree (`layer_mapping.py:LayerTrie`), so its name is the key.
    """
    types = {c.module: c.type for c in npu.calls} if npu is not None else {}
    out: dict[str, dict[str, str]] = {}
    for src, dst in mapping.renames:
        parent, _, child = src.rpartition(".")
        dparent, _, dchild = dst.rpartition(".")
        if parent != dparent:
            continue  # msprobe renames children of one parent only
        key = "TopLayer" if not parent else types.get(parent, parent.rpartition(".")[2])
        out.setdefault(key, {})[child] = dchild
    return out


def data_mapping(npu: Dump, gpu: Dump, mapping: DumpMapping) -> tuple[dict[str, str], list[str]]:
    """msprobe's data mapping between two msprobe dumps: every matched call's inputs, outputs and parameters and
    every parameter gradient whose spec rule only renames; and the parameters left out (their layout differs:
    msprobe would compare them unconverted), as `npu -> gpu (ops)` lines."""
    out: dict[str, str] = {}
    left_out: list[str] = []
    by_gpu = {(c.module, c.index): c for c in gpu.calls}
    renamed = {s: (t, m.ops_text) for m in mapping.params for s, t in zip(m.sources, m.targets, strict=False)
               if len(m.sources) == len(m.targets)}
    for c in npu.calls:
        g = by_gpu.get((mapping.gpu_module(c.module), c.index))
        if g is None or not c.origin or not g.origin:
            continue
        for kind, n_items, g_items in (("input", c.inputs, g.inputs), ("output", c.outputs, g.outputs)):
            for i in range(min(len(n_items), len(g_items))):
                out[f"{c.origin}.{kind}.{i}"] = f"{g.origin}.{kind}.{i}"
    gpu_grad_origin = {name: e.origin for name, e in gpu.params.items()}
    for name, e in npu.params.items():
        target = renamed.get(name)
        if target is None:
            continue
        tname, ops = target
        if ops != "rename":
            left_out.append(f"{name} -> {tname} ({ops})")
            continue
        if e.loaded and tname in gpu.params and gpu.params[tname].loaded:
            out[str(e.loaded)] = str(gpu.params[tname].loaded)
        if e.origin and gpu_grad_origin.get(tname):
            out[f"{e.origin}.{name.rpartition('.')[2]}"] = f"{gpu_grad_origin[tname]}.{tname.rpartition('.')[2]}"
    return out, left_out


def write_mapping_files(out_dir: Path, mapping: DumpMapping, npu: Dump | None = None, gpu: Dump | None = None
                        ) -> dict[str, Path]:
    """`layer_mapping.yaml` (always) and `data_mapping.yaml` (given both msprobe dumps) for `msprobe compare`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"layer_mapping": out_dir / "layer_mapping.yaml"}
    files["layer_mapping"].write_text(yaml.safe_dump(layer_mapping(mapping, npu), sort_keys=False), encoding="utf-8")
    if npu is not None and gpu is not None:
        pairs, left_out = data_mapping(npu, gpu, mapping)
        header = "".join(f"# not mapped (layout differs, compare with `alignflow diagnose-dumps`): {x}\n"
                         for x in left_out)
        files["data_mapping"] = out_dir / "data_mapping.yaml"
        files["data_mapping"].write_text(header + yaml.safe_dump(pairs, sort_keys=False), encoding="utf-8")
    return files


# ---------------------------------------------------------------------------------------------- setup

def msprobe_config(dump_path: str, *, step: int = 1, task: str = "tensor", level: str = "L0",
                   ranks: Iterable[int] = ()) -> dict[str, Any]:
    """The `config.json` that dumps training step `step` (1-based; msprobe counts `debugger.step()` from 0)."""
    if task not in ("tensor", "statistics"):
        raise ConfigError(f"msprobe task {task!r}: diagnose reads 'tensor' or 'statistics' dumps")
    section = {"scope": [], "list": [], "data_mode": ["all"]}
    return {"task": task, "dump_path": dump_path, "rank": list(ranks), "step": [step - 1, step], "level": level,
            task: section | ({"summary_mode": "statistics"} if task == "statistics" else {})}


def setup_text(config_path: str) -> dict[str, str]:
    """What to add on each side so that one training dumps through msprobe (the steps listed in config.json; the
    next step's parameters are the updated values)."""
    megatron = f"""# megatron/training/training.py, train(): once before the training loop
from msprobe.pytorch import PrecisionDebugger
debugger = PrecisionDebugger(config_path="{config_path}")
# in the loop, around train_step(...):
debugger.start(model=model)
...  # train_step(forward_step_func, train_data_iterator, model, optimizer, ...)
debugger.stop()
debugger.step()
# launch: pretrain_gpt.py ... --deterministic-mode --no-gradient-accumulation-fusion (hooks need eager modules)
"""
    mindformers = f"""# MindFormers YAML (PyNative trainer): this callback (importable on the NPU host) turns msprobe on
callbacks:
  - type: MsprobeDumpCallback
    config_path: "{config_path}"
# msprobe_callback.py (register before run_mindformer.py builds the trainer):
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
from mindspore.train.callback import Callback
from msprobe.mindspore import PrecisionDebugger

@MindFormerRegister.register(MindFormerModuleType.CALLBACK)
class MsprobeDumpCallback(Callback):
    def __init__(self, config_path):
        self.debugger = PrecisionDebugger(config_path=config_path)
    def on_train_step_begin(self, run_context):
        self.debugger.start(model=run_context.original_args().train_network)
    def on_train_step_end(self, run_context):
        self.debugger.stop()
        self.debugger.step()
"""
    return {"gpu_megatron": megatron, "npu_mindformers": mindformers}
