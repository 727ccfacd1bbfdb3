"""A stand-in for `hyper_parallel`, the package MindFormers 2.1.0's PyNative trainer imports for parallelism.

Why: `mindformers==2.1.0` requires `hyper-parallel~=1.0.0`, which is not on PyPI, and MindFormers imports dozens of
its names at module level (`pynative/trainer/trainer.py` alone: `_MicroBatch`, `DTensor`, `HSDPModule`,
`enable_mindspore_backward_compat`). A single-process PyNative training calls only four of them
(`get_platform`, `Replicate`, `Shard`, `SkipDTensorDispatch`) plus the `Tensor.backward` support; every other
name is imported but never used on one rank.

What replaces it: an import hook that serves `hyper_parallel` and every submodule as a stand-in module.
- Names of the single-process path behave as on one rank: `Replicate`/`Shard` are placement values,
  `SkipDTensorDispatch` is a no-op context manager (there is no DTensor to dispatch), `get_platform()` returns
  an object whose collectives are identities on a world of one, and `enable_mindspore_backward_compat` gives
  MindSpore tensors the torch-style `requires_grad`/`grad`/`backward` that MindSpore 2.10 implements natively
  (`mindspore._c_expression.run_backward`) but does not expose as methods.
- Every other name is a class that can be imported, subclassed and used in `isinstance` checks (always False:
  no object is ever a DTensor here) but raises `HyperParallelUnavailable` when called, naming itself — so a
  code path that needs real parallelism fails loudly instead of running something else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

PACKAGE = "hyper_parallel"


class HyperParallelUnavailable(RuntimeError):
    """A hyper_parallel feature beyond one process was reached in the CPU lab."""


class _Unavailable:
    """Base of every stand-in name outside the single-process path."""

    _qualname = PACKAGE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise HyperParallelUnavailable(f"{self._qualname} is not available in the MindFormers CPU lab (hyper_parallel "
                                       "is not installed; one process uses only get_platform, Replicate, Shard and "
                                       "SkipDTensorDispatch)")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()


def _unavailable(qualname: str) -> type:
    return type(qualname.rsplit(".", 1)[-1], (_Unavailable,), {"_qualname": qualname, "__module__": PACKAGE})


class Placement:
    """Base of DTensor placements (hyper_parallel.core.dtensor.placement_types)."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


class Replicate(Placement):
    """The tensor is whole on every rank: on one rank, the tensor itself."""

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Replicate)

    def __hash__(self) -> int:
        return hash("Replicate")

    def __repr__(self) -> str:
        return "Replicate()"


class Shard(Placement):
    """The tensor is split along `dim` over a mesh axis: on one rank the only shard is the whole tensor."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(("Shard", self.dim))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"


class SkipDTensorDispatch:
    """Context manager that turns off DTensor op dispatch; with no DTensor on one rank it does nothing."""

    def __enter__(self) -> SkipDTensorDispatch:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Platform:
    """`get_platform()`: the MindSpore platform's collectives on a world of one are identities."""

    name = "mindspore"

    def differentiable_all_reduce(self, tensor: Any, op: str, group: Any = None) -> Any:
        return tensor

    def __getattr__(self, name: str) -> Any:
        return _unavailable(f"{PACKAGE}.platform.get_platform().{name}")


_PLATFORM = _Platform()


def get_platform() -> _Platform:
    return _PLATFORM


_BACKWARD_ENABLED = False


def enable_mindspore_backward_compat() -> None:
    """Give MindSpore tensors torch-style autograd methods, as the trainer's `loss.backward(sense)` needs.

    MindSpore 2.10's PyNative executor keeps `_requires_grad`, `_grad`, `_grad_node`, ... on every tensor and
    implements the backward pass in `run_backward`; this exposes them under the torch names MindFormers uses.
    """
    global _BACKWARD_ENABLED
    if _BACKWARD_ENABLED:
        return
    from mindspore._c_expression import TensorPy, pyboost_detach, run_backward
    from mindspore.graph.api import _pynative_executor

    def _get_requires_grad(self: Any) -> bool:
        return bool(self._requires_grad)

    def _set_requires_grad(self: Any, value: bool = True) -> None:
        if not isinstance(value, bool):
            raise TypeError("requires_grad must be a bool")
        self._requires_grad = value

    def _set_grad(self: Any, value: Any) -> None:
        self._grad = value

    def backward(self: Any, gradient: Any = None, retain_graph: Any = None, create_graph: bool = False,
                 inputs: Any = None) -> Any:
        inputs = tuple(inputs) if isinstance(inputs, list) else inputs
        if isinstance(gradient, list):
            gradient = tuple(gradient)
        elif gradient is not None and not isinstance(gradient, tuple):
            gradient = (gradient,)  # one output, one sensitivity (run_backward takes a tuple or None)
        return run_backward((self,), gradient, retain_graph, create_graph, inputs, allow_unreachable=True,
                            accumulate_grad=True)

    _pynative_executor.set_grad_flag(True)
    TensorPy.requires_grad = property(_get_requires_grad, _set_requires_grad)
    TensorPy.grad = property(lambda self: self._grad, _set_grad)
    TensorPy.backward = backward
    TensorPy.is_leaf = property(lambda self: self._is_leaf)
    TensorPy.retains_grad = property(lambda self: self._retains_grad)
    TensorPy.retain_grad = lambda self: self._retain_grad()
    TensorPy.grad_fn = property(lambda self: self._grad_node)
    TensorPy.output_nr = property(lambda self: self._output_index)
    TensorPy.detach = lambda self: pyboost_detach(self)
    _BACKWARD_ENABLED = True


# The names with single-process behaviour, wherever MindFormers imports them from.
_WORKING: dict[str, Any] = {
    "Placement": Placement,
    "Replicate": Replicate,
    "Shard": Shard,
    "SkipDTensorDispatch": SkipDTensorDispatch,
    "get_platform": get_platform,
    "enable_mindspore_backward_compat": enable_mindspore_backward_compat,
}


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _WORKING.get(name) or _unavailable(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name, "MindFormers CPU lab stand-in (see alignflow.labs.mindformers_cpu)")
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Serve `hyper_parallel` from the stand-in; refuse if a real hyper_parallel is importable or imported."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    import importlib.util

    if PACKAGE in sys.modules or importlib.util.find_spec(PACKAGE) is not None:
        raise HyperParallelUnavailable("a real hyper_parallel is installed: the CPU lab's stand-in would shadow it; "
                                       "run without the lab on a host that has hyper_parallel")
    sys.meta_path.insert(0, _Finder())
