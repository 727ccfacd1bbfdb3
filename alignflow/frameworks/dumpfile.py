"""The twin's native dump of one training step: what a side held, computed and wrote, tensor by tensor.

A dump directory (one per side) holds

```
dump.json            framework, step, module calls in execution order, parameters, scalars, optimizer settings
tensors.safetensors  every tensor named in dump.json (fp32, or the integer dtype it had)
```

`calls` follow msprobe's module-level (L0) dump: one entry per module *call*, in the order the calls start
(a module called twice — the embedding of the main and the MTP path — has two entries, `index` 0 and 1), each
with its tensor inputs and outputs and the call that was running when it started (`parent`). `parameters`
hold, per parameter, the value after load (after the bf16 write-back of the freshly loaded weights), the
gradient (accumulated over the step's micro-batches, before clipping) and the value after the optimizer update.

The budget is enforced while the step runs: the writer counts the bytes of every tensor it is handed, keeps
them in memory, and refuses — before a single file is written — as soon as the total would pass the budget.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from alignflow.errors import AlignflowError, ConfigError

DUMP_JSON = "dump.json"
TENSORS = "tensors.safetensors"
FORMAT = "alignflow-twin-dump"
VERSION = 1
DEFAULT_BUDGET_BYTES = 2 * 1024**3  # 2 GB per side (issue 21)
DUMP_ENV = "ALIGNFLOW_TWIN_DUMP"  # path of the DumpRequest JSON a twin training reads

Array = npt.NDArray[Any]


class DumpBudgetExceeded(AlignflowError):
    """A dump would be larger than its budget; nothing was written."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class DumpRequest:
    """What one side must dump: where, which step, within which budget."""

    dump_path: str
    step: int = 1
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    side: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str) -> DumpRequest:
        try:
            request = cls(dump_path=str(data["dump_path"]), step=int(data.get("step", 1)),
                          budget_bytes=int(data.get("budget_bytes", DEFAULT_BUDGET_BYTES)),
                          side=str(data.get("side", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: not a dump request ({exc!r}); expected dump_path, step, budget_bytes"
                              ) from None
        if request.step < 1 or request.budget_bytes < 1:
            raise ConfigError(f"{where}: step and budget_bytes must be >= 1")
        return request


def request_from_env(env: Mapping[str, str]) -> DumpRequest | None:
    """The dump request a training process was started with (`$ALIGNFLOW_TWIN_DUMP`), or None."""
    path = env.get(DUMP_ENV)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{DUMP_ENV}={path}: cannot read the dump request: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{DUMP_ENV}={path}: a dump request is a JSON object")
    return DumpRequest.from_json(data, where=f"{DUMP_ENV}={path}")


@dataclass(slots=True)
class Call:
    """One module call: its tensor inputs and outputs (keys into the tensor file)."""

    id: int
    module: str
    index: int  # how many earlier calls of the same module this step
    type: str
    parent: int | None
    inputs: list[str | None] = field(default_factory=list)  # None: a tensor position on one side only
    outputs: list[str | None] = field(default_factory=list)
    origin: str = ""  # the framework dump's own name of the call (msprobe: `Module.fc1.Linear.forward.0`)

    @property
    def label(self) -> str:
        return self.module if self.index == 0 else f"{self.module}#{self.index}"


@dataclass(slots=True)
class ParamEntry:
    name: str
    trainable: bool
    loaded: str | None = None
    grad: str | None = None
    updated: str | None = None
    origin: str = ""  # msprobe: the `parameters_grad` entry naming the gradient


def budget_text(budget_bytes: int) -> str:
    return f"{budget_bytes / 1e9:.3g} GB ({budget_bytes} bytes)"


class DumpWriter:
    """Collects one side's tensors in memory (refusing past the budget) and writes the dump atomically."""

    def __init__(self, request: DumpRequest, *, framework: str) -> None:
        self.request = request
        self.framework = framework
        self.calls: list[Call] = []
        self.params: dict[str, ParamEntry] = {}
        self.scalars: dict[str, float] = {}
        self.optimizer: dict[str, Any] = {}
        self.notes: list[str] = []
        self._tensors: dict[str, Array] = {}
        self._seen: dict[str, int] = {}
        self.bytes = 0

    def tensor(self, key: str, value: Array) -> str:
        """Keep `value` under `key`; raises `DumpBudgetExceeded` (nothing written) past the budget."""
        array = np.ascontiguousarray(value)
        if array.dtype.kind == "f" and array.dtype != np.float32:
            array = array.astype(np.float32)
        size = int(array.nbytes)
        if self.bytes + size > self.request.budget_bytes:
            raise DumpBudgetExceeded(
                f"{self.request.side or self.framework} dump of step {self.request.step}: more than the dump budget "
                f"of {budget_text(self.request.budget_bytes)} (at {key}); nothing was written — raise "
                "--dump-budget or dump fewer modules")
        self._tensors[key] = array
        self.bytes += size
        return key

    def discard(self, key: str) -> None:
        """Forget a tensor kept earlier (replaced by what the dump records instead)."""
        array = self._tensors.pop(key, None)
        if array is not None:
            self.bytes -= int(array.nbytes)

    def begin_call(self, module: str, type_name: str, parent: int | None) -> Call:
        index = self._seen.get(module, 0)
        self._seen[module] = index + 1
        call = Call(len(self.calls), module, index, type_name, parent)
        self.calls.append(call)
        return call

    def param(self, name: str, stage: str, value: Array, *, trainable: bool) -> None:
        entry = self.params.setdefault(name, ParamEntry(name, trainable))
        setattr(entry, stage, self.tensor(f"param/{name}/{stage}", value))

    def write(self) -> Path:
        """Write `dump.json` and the tensors to `request.dump_path` (a fresh directory, renamed into place)."""
        from safetensors.numpy import save_file

        target = Path(self.request.dump_path)
        if target.exists():
            raise ConfigError(f"{target}: already exists; a dump never overwrites another")
        tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            save_file(self._tensors, str(tmp / TENSORS))
            meta = {"format": FORMAT, "version": VERSION, "framework": self.framework, "side": self.request.side,
                    "step": self.request.step, "bytes": self.bytes, "budget_bytes": self.request.budget_bytes,
                    "calls": [asdict(c) for c in self.calls], "parameters": [asdict(p) for p in self.params.values()],
                    "scalars": self.scalars, "optimizer": self.optimizer, "notes": self.notes}
            (tmp / DUMP_JSON).write_text(json.dumps(meta, indent=1), encoding="utf-8")
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target


@dataclass(frozen=True, slots=True)
class Dump:
    """One side's dump, read back: metadata in memory, tensors on demand."""

    path: Path
    framework: str
    side: str
    step: int
    calls: tuple[Call, ...]
    params: dict[str, ParamEntry]
    scalars: dict[str, float]
    optimizer: dict[str, Any]
    notes: tuple[str, ...]
    bytes: int
    tensor_file: Path | None  # None: a statistics-only dump (msprobe `task: statistics`)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)  # key -> Max/Min/Mean/Norm when no tensors
    files: dict[str, Path] = field(default_factory=dict)  # key -> one tensor file (msprobe `dump_tensor_data/`)

    @contextmanager
    def reader(self) -> Iterator[TensorReader]:
        if self.tensor_file is None:
            yield TensorReader(None, self)
            return
        from safetensors import safe_open

        with safe_open(str(self.tensor_file), framework="np") as handle:
            yield TensorReader(handle, self)


class TensorReader:
    """`get(key)` -> the tensor (fp64 for comparison), or None when the dump has none under that key."""

    def __init__(self, handle: Any, dump: Dump) -> None:
        self._handle = handle
        self._dump = dump
        self._keys = set(handle.keys()) if handle is not None else set()

    def get(self, key: str | None) -> Array | None:
        if key is None:
            return None
        if key in self._dump.files:
            return load_tensor_file(self._dump.files[key])
        if key not in self._keys:
            return None
        return np.asarray(self._handle.get_tensor(key))

    def stats(self, key: str | None) -> dict[str, float] | None:
        return None if key is None else self._dump.stats.get(key)


def load_tensor_file(path: Path) -> Array:
    """One msprobe tensor file: `.npy` (MindSpore) or `.pt` (PyTorch, loaded with weights_only)."""
    if path.suffix == ".npy":
        return np.asarray(np.load(path, allow_pickle=False))
    import torch

    value = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(value, torch.Tensor):
        raise ConfigError(f"{path}: holds a {type(value).__name__}, not a tensor")
    return (value.float() if value.dtype == torch.bfloat16 else value).numpy()


def read_dump(path: str | Path) -> Dump:
    """Read a native dump directory; `ConfigError` naming the file when it is not one."""
    root = Path(path)
    meta_path = root / DUMP_JSON
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{meta_path}: not a readable dump ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConfigError(f"{meta_path}: not an alignflow twin dump (format {meta.get('format')!r}); an msprobe "
                          "dump is read with alignflow.diagnose.msprobe.read_msprobe_dump")
    try:
        calls = tuple(Call(**c) for c in meta["calls"])
        params = {p["name"]: ParamEntry(**p) for p in meta["parameters"]}
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{meta_path}: malformed dump ({exc!r})") from None
    return Dump(root, str(meta["framework"]), str(meta.get("side", "")), int(meta["step"]), calls, params,
                dict(meta.get("scalars", {})), dict(meta.get("optimizer", {})), tuple(meta.get("notes", ())),
                int(meta.get("bytes", 0)), root / TENSORS)
