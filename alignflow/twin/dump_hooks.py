"""The module-call recorder both twins dump through: forward pre-hooks and forward hooks turn module calls into
`alignflow.frameworks.dumpfile` calls, the first micro-batch of the step only.

What differs between the sides is how a hook's arguments hold tensors and how a tensor becomes a numpy copy;
each side's recorder (`torch_dump.TorchRecorder`, `ms_dump.MindSporeRecorder`) says that and registers the hooks
on its framework's modules, then records parameters, gradients and updates in its framework's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alignflow.frameworks.dumpfile import Array, Call, DumpRequest, DumpWriter


class HookRecorder:
    """Records the module calls of one step into a `DumpWriter`; `tensors` lists the tensors of a hook's
    arguments, `numpy` copies one tensor out (never a view: the optimizer updates parameters in place)."""

    def __init__(self, request: DumpRequest, *, framework: str, tensors: Callable[[Any], list[Any]],
                 numpy: Callable[[Any], Array]) -> None:
        self.writer = DumpWriter(request, framework=framework)
        self.recording = True
        self._tensors = tensors
        self._numpy = numpy
        self._stack: list[Call] = []
        self._handles: list[Any] = []  # the frameworks' hook handles, removed by `write`

    def _pre(self, name: str, module: object, args: Any) -> None:
        if not self.recording:
            return
        call = self.writer.begin_call(name, type(module).__name__, self._stack[-1].id if self._stack else None)
        call.inputs = self._keep(call, "input", args)
        self._stack.append(call)

    def _post(self, name: str, module: object, args: Any, output: Any) -> None:
        if not self.recording:
            return
        call = self._stack.pop()
        assert call.module == name, (call.module, name)
        call.outputs = self._keep(call, "output", output)

    def _keep(self, call: Call, kind: str, value: Any) -> list[str | None]:
        """Hand the tensors of a hook argument to the writer; their keys."""
        return [self.writer.tensor(f"call/{call.id}/{kind}/{i}", self._numpy(t))
                for i, t in enumerate(self._tensors(value))]

    def stop_forward(self) -> None:
        """Later micro-batches of the step are not recorded (their calls repeat the first one's)."""
        self.recording = False

    def write(self, *, scalars: dict[str, float], optimizer: dict[str, Any]) -> None:
        for handle in self._handles:
            handle.remove()
        self.writer.scalars.update(scalars)
        self.writer.optimizer.update(optimizer)
        self.writer.write()
