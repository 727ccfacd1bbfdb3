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

from alignflow.frameworks.dumpfile import Call, DumpRequest, DumpWriter


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _tensors(item)]
    return []


def _numpy(t: Any) -> Any:
    return (t.astype(ms.float32) if t.dtype == ms.bfloat16 else t).asnumpy().copy()  # never a view of a parameter


class MindSporeRecorder:
    """Attach to a network before the step; call `loaded`, `grads`, `updated`, then `write`."""

    def __init__(self, request: DumpRequest, net: nn.Cell) -> None:
        from alignflow.twin.ms_model import MoELayer

        self.writer = DumpWriter(request, framework="mindspore")
        self.recording = True
        self._stack: list[Call] = []
        self._handles = []
        for name, cell in net.cells_and_names():
            if not name:
                continue
            self._handles.append(cell.register_forward_pre_hook(partial(self._pre, name)))
            self._handles.append(cell.register_forward_hook(partial(self._post, name)))
            if isinstance(cell, MoELayer):
                route = cell._route
                object.__setattr__(cell, "_route", partial(self._route, f"{name}.router", route))

    def _pre(self, name: str, cell: nn.Cell, inputs: Any) -> None:
        if not self.recording:
            return
        call = self.writer.begin_call(name, type(cell).__name__, self._stack[-1].id if self._stack else None)
        call.inputs = [self.writer.tensor(f"call/{call.id}/input/{i}", _numpy(t))
                       for i, t in enumerate(_tensors(inputs))]
        self._stack.append(call)

    def _post(self, name: str, cell: nn.Cell, inputs: Any, outputs: Any) -> None:
        if not self.recording:
            return
        call = self._stack.pop()
        assert call.module == name, (call.module, name)
        call.outputs = [self.writer.tensor(f"call/{call.id}/output/{i}", _numpy(t))
                        for i, t in enumerate(_tensors(outputs))]

    def _route(self, router: str, route: Any, logits: Tensor) -> Any:
        result = route(logits)
        if self.recording:
            call = next(c for c in reversed(self.writer.calls) if c.module == router)
            for key in call.outputs:
                if key is not None:
                    self.writer.discard(key)
            probs, counts = result[0], result[1]
            call.outputs = [self.writer.tensor(f"call/{call.id}/output/{i}", _numpy(t))
                            for i, t in enumerate((probs, counts))]
        return result

    def stop_forward(self) -> None:
        self.recording = False

    def loaded(self, net: nn.Cell) -> None:
        for p in net.get_parameters():
            self.writer.param(p.name, "loaded", _numpy(p.value()), trainable=bool(p.requires_grad))

    def grads(self, params: list[Any], grads: Any) -> None:
        for p, g in zip(params, grads, strict=True):
            self.writer.param(p.name, "grad", _numpy(g), trainable=True)

    def updated(self, params: list[Any]) -> None:
        for p in params:
            self.writer.param(p.name, "updated", _numpy(p.value()), trainable=True)

    def write(self, *, scalars: dict[str, float], optimizer: dict[str, Any]) -> None:
        for handle in self._handles:
            handle.remove()
        self.writer.scalars.update(scalars)
        self.writer.optimizer.update(optimizer)
        self.writer.write()
