"""The PyTorch twin's dump hooks: module calls, parameters, gradients and updates of one training step.

What msprobe's PyTorch `PrecisionDebugger` (level L0, task tensor) records for a real Megatron run, recorded
natively for the twin (`alignflow.frameworks.dumpfile` has the format): a forward pre-hook and a forward hook on
every module (the first micro-batch of the step), then the parameters after load, their gradients after the
backward passes and their values after the optimizer step. Megatron's `Router` returns `(probs, counts, aux)`;
the dense routing probabilities are its first output, as on the MindSpore side.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from alignflow.frameworks.dumpfile import DumpRequest
from alignflow.twin.dump_hooks import HookRecorder


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a hook's args/output, tuples flattened (lists, like the MoE bookkeeping, left out)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple):
        return [t for item in value for t in _tensors(item)]
    return []


def _numpy(t: torch.Tensor) -> Any:
    """A copy: a parameter's `.numpy()` shares its memory, and the optimizer updates it in place."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()


class TorchRecorder(HookRecorder):
    """Attach to a model before the step; call `loaded`, `grads`, `updated`, then `write`."""

    def __init__(self, request: DumpRequest, model: nn.Module) -> None:
        super().__init__(request, framework="pytorch", tensors=_tensors, numpy=_numpy)
        for name, module in model.named_modules():
            if name:
                self._handles.append(module.register_forward_pre_hook(partial(self._pre, name)))
                self._handles.append(module.register_forward_hook(partial(self._post, name)))

    def loaded(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            self.writer.param(name, "loaded", _numpy(p), trainable=p.requires_grad)
        for name, b in model.named_buffers():
            self.writer.param(name, "loaded", _numpy(b), trainable=False)

    def grads(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if p.grad is not None:
                self.writer.param(name, "grad", _numpy(p.grad), trainable=True)

    def updated(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if p.requires_grad:
                self.writer.param(name, "updated", _numpy(p), trainable=True)
