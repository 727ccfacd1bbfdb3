"""A stand-in `transformer_engine` package, so that megatron-core's Transformer Engine code paths can be walked on a
machine where Transformer Engine cannot exist (no CUDA: its `transformer_engine_torch` extension is built with nvcc
against a CUDA torch).

What it is for: megatron-core decides at import time whether TE is there (`HAVE_TE` in
`megatron/core/extensions/transformer_engine.py`) and, without it, its TE layer specs cannot even be selected
(`TESpecProvider` is None). With this package installed first, megatron-core imports as on a TE host: every name
under `transformer_engine` is a class (`transformer_engine.pytorch.Linear`, ...) that accepts any arguments and does
nothing, and `transformer_engine.__version__` is the release the checks assume. So megatron-core's own config checks,
TE spec selection and the specs' own assertions run for real; **nothing of Transformer Engine itself is checked**, and
no module built on these classes computes anything: `alignflow.frameworks.megatron_build` stops TE checks at the spec
level and says so.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

ROOT = "transformer_engine"


class _StandInMeta(type):
    """Any attribute of a stand-in class is another stand-in class (`te.pytorch.ops.Sequential`)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _StandInMeta(name, (StandIn,), {"__module__": cls.__module__,
                                              "__qualname__": f"{cls.__qualname__}.{name}"})
        setattr(cls, name, sub)
        return sub


class StandIn(metaclass=_StandInMeta):
    """Accepts any arguments; any attribute is a stand-in class; truthy; calls return a stand-in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return StandIn()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _StandInMeta(name, (StandIn,), {"__module__": self.__name__, "__qualname__": name})
        setattr(self, name, cls)
        return cls


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, version: str) -> None:
        self.version = version

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == ROOT or fullname.startswith(ROOT + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        if spec.name == ROOT:
            module.__version__ = self.version  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install(version: str) -> None:
    """Make `import transformer_engine` (and any submodule) give the stand-in, reporting TE `version`. Call before
    megatron-core is imported; refuses to shadow a real Transformer Engine."""
    if ROOT in sys.modules or importlib.util.find_spec(ROOT) is not None:
        raise RuntimeError("a real transformer_engine is importable here: the stand-in would hide it")
    sys.meta_path.insert(0, _Finder(version))
