# mypy: allow-subclassing-any
"""The MindSpore side's AdamW, global-norm clipping and bf16 write-back, written out term by term.

The PyTorch side (`torch_optim.py`) computes the same formula in the same order
(docs/seeds.md#glm-52-problems-and-fixes: the GPU side
was aligned to the NPU update formula, then both wrote the parameters back in bf16):

    g  = grad * clip_coeff                         clip_coeff = min(1, max_norm / (||grad|| + 1e-6))
    m  = beta1 * m + (1 - beta1) * g
    v  = beta2 * v + (1 - beta2) * g * g
    w  = w * (1 - lr * wd)                         matrices only (Megatron's no-decay group: 1-D tensors)
    w  = w - lr * (m / bc1) / (sqrt(v / bc2) + eps)     bc = 1 - beta^t
    param = bf16(w) if bf16 parameters else w      the fp32 master `w` stays with the optimizer

State names follow MindFormers' PyNative optimizer file: `adam_m.<param>`, `adam_v.<param>`,
`main_param.<param>` (bf16 runs) and `global_step`.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from alignflow.twin.schedule import OptimSettings, decays


class AdamW(nn.Cell):
    """AdamW over `params`; `construct(grads, lr, bc1, bc2, clip_coeff)` updates them in place."""

    def __init__(self, params: list[Parameter], settings: OptimSettings) -> None:
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(params)
        self.settings = settings
        self.m = ms.ParameterTuple([Parameter(ops.zeros_like(p), name=f"adam_m.{p.name}", requires_grad=False)
                                    for p in params])
        self.v = ms.ParameterTuple([Parameter(ops.zeros_like(p), name=f"adam_v.{p.name}", requires_grad=False)
                                    for p in params])
        self.bf16 = settings.bf16_params
        self.master = ms.ParameterTuple([Parameter(p.value().copy(), name=f"main_param.{p.name}",
                                                   requires_grad=False) for p in params]) if self.bf16 else self.params
        self.wd = tuple(settings.weight_decay if decays(p.name, len(p.shape)) else 0.0 for p in params)
        self.beta1, self.beta2, self.eps = settings.beta1, settings.beta2, settings.eps

    def construct(self, grads: tuple[Tensor, ...], lr: Tensor, bc1: Tensor, bc2: Tensor, clip: Tensor) -> Tensor:
        for i in range(len(self.params)):
            g = grads[i] * clip
            m = self.beta1 * self.m[i] + (1.0 - self.beta1) * g
            v = self.beta2 * self.v[i] + (1.0 - self.beta2) * g * g
            w = self.master[i]
            if self.wd[i] != 0.0:
                w = w * (1.0 - lr * self.wd[i])
            w = w - lr * (m / bc1) / (ops.sqrt(v / bc2) + self.eps)
            ops.assign(self.m[i], m)
            ops.assign(self.v[i], v)
            if self.bf16:
                ops.assign(self.master[i], w)
                ops.assign(self.params[i], w.astype(ms.bfloat16).astype(ms.float32))
            else:
                ops.assign(self.params[i], w)
        return lr

    def round_params_to_bf16(self) -> None:
        """bf16 write-back of freshly loaded weights: master = loaded fp32 value, parameter = bf16(master)."""
        if not self.bf16:
            return
        for p, w in zip(self.params, self.master, strict=True):
            w.set_data(p.value().copy())
            p.set_data(p.value().astype(ms.bfloat16).astype(ms.float32))

    def state(self) -> list[dict[str, Any]]:
        """Optimizer tensors in MindFormers' naming (the `-opt-` file)."""
        out: list[dict[str, Any]] = []
        for group in (self.m, self.v) + ((self.master,) if self.bf16 else ()):
            out += [{"name": p.name, "data": p.value()} for p in group]
        return out

    def load_state(self, tensors: dict[str, Any], *, where: str) -> None:
        from alignflow.errors import ConfigError

        groups = (self.m, self.v) + ((self.master,) if self.bf16 else ())
        missing = [p.name for group in groups for p in group if p.name not in tensors]
        if missing:
            raise ConfigError(f"{where}: optimizer file lacks {len(missing)} tensors, e.g. {missing[:3]}")
        for group in groups:
            for p in group:
                p.set_data(tensors[p.name].astype(ms.float32))


def global_norm(grads: tuple[Tensor, ...]) -> Tensor:
    """The fp32 L2 norm of all gradients (pre-clip; what both frameworks log)."""
    total = ops.zeros((), ms.float32)
    for g in grads:
        total = total + (g * g).sum()
    return ops.sqrt(total)


def add_grads(acc: tuple[Tensor, ...], grads: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    out: tuple[Tensor, ...] = ()
    for a, g in zip(acc, grads, strict=True):
        out = (*out, a + g)
    return out
