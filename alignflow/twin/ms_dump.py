"""The MindSpore twin's dump hooks: cell calls, parameters, gradients and updates of one training step.

What msprobe's MindSpore `PrecisionDebugger` (level L0, task tensor) records for a PyNative MindFormers run,
recorded natively for the twin (format: `alignflow.frameworks.dumpfile`). Cell hooks only fire in PyNative mode,
so a dumping step runs without `mindspore.jit`. The MoE layer's router cell is a plain linear (logits) and the
routing itself is a method of the MoE layer; the dump records that routing — dense probabilities and routed
counts — as the router call's outputs, which is what Megatron's `Router` module returns on the other side.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import mindspore as ms
from mindspore import Tensor, nn

from alignflow.frameworks.dumpfile import DumpRequest
from alignflow.twin.dump_hooks import HookRecorder


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _tensors(item)]
    return []


def _numpy(t: Any) -> Any:
    return (t.astype(ms.float32) if t.dtype == ms.bfloat16 else t).asnumpy().copy()  # never a view of a parameter


class MindSporeRecorder(HookRecorder):
    """Attach to a network before the step; call `loaded`, `grads`, `updated`, then `write`."""

    def __init__(self, request: DumpRequest, net: nn.Cell) -> None:
        from alignflow.twin.ms_model import MoELayer

        super().__init__(request, framework="mindspore", tensors=_tensors, numpy=_numpy)
        for name, cell in net.cells_and_names():
            if not name:
                continue
            self._handles.append(cell.register_forward_pre_hook(partial(self._pre, name)))
            self._handles.append(cell.register_forward_hook(partial(self._post, name)))
            if isinstance(cell, MoELayer):
                route = cell._route
                object.__setattr__(cell, "_route", partial(self._route, f"{name}.router", route))

    def _route(self, router: str, route: Any, logits: Tensor) -> Any:
        result = route(logits)
        if self.recording:
            call = next(c for c in reversed(self.writer.calls) if c.module == router)
            for key in call.outputs:
                if key is not None:
                    self.writer.discard(key)
            call.outputs = self._keep(call, "output", (result[0], result[1]))  # probabilities, routed counts
        return result

    def loaded(self, net: nn.Cell) -> None:
        for p in net.get_parameters():
            self.writer.param(p.name, "loaded", _numpy(p.value()), trainable=bool(p.requires_grad))

    def grads(self, params: list[Any], grads: Any) -> None:
        for p, g in zip(params, grads, strict=True):
            self.writer.param(p.name, "grad", _numpy(g), trainable=True)

    def updated(self, params: list[Any]) -> None:
        for p in params:
            self.writer.param(p.name, "updated", _numpy(p.value()), trainable=True)
