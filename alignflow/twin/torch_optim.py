"""The PyTorch side's AdamW, global-norm clipping and bf16 write-back, written out term by term.

Not `torch.optim.AdamW` (whose `lerp`/`addcdiv` order rounds differently): the same formula and order as the
MindSpore side (`ms_optim.py`), as the seeds' GPU side was aligned to the NPU update
(docs/seeds.md#glm-52-problems-and-fixes):

    g  = grad * clip_coeff                         clip_coeff = min(1, max_norm / (||grad|| + 1e-6))
    m  = beta1 * m + (1 - beta1) * g
    v  = beta2 * v + (1 - beta2) * g * g
    w  = w * (1 - lr * wd)                         matrices only (Megatron's no-decay group: 1-D tensors)
    w  = w - lr * (m / bc1) / (sqrt(v / bc2) + eps)     bc = 1 - beta^t
    param = bf16(w) if --bf16 else w               the fp32 master `w` stays with the optimizer

The state saves into the legacy checkpoint's `optimizer` entry as plain tensors (weights_only-loadable).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from alignflow.errors import ConfigError
from alignflow.twin.schedule import OptimSettings, decays


class AdamW:
    """AdamW over the trainable parameters of `model`, keyed by their (local) names."""

    def __init__(self, model: nn.Module, settings: OptimSettings) -> None:
        self.settings = settings
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.m = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.master = {n: p.detach().clone() for n, p in self.params.items()} if settings.bf16_params else None
        self.wd = {n: settings.weight_decay if decays(n, p.ndim) else 0.0 for n, p in self.params.items()}

    @torch.no_grad()
    def step(self, lr: float, step: int, clip_coeff: float) -> None:
        s = self.settings
        bc1, bc2 = s.bias_corrections(step)
        # fp32 scalars, as the MindSpore side passes them (1 - lr * wd is then computed in fp32 on both sides)
        lr_t = torch.tensor(lr, dtype=torch.float32)
        for name, p in self.params.items():
            assert p.grad is not None
            g = p.grad * clip_coeff
            m = s.beta1 * self.m[name] + (1.0 - s.beta1) * g
            v = s.beta2 * self.v[name] + (1.0 - s.beta2) * g * g
            w = self.master[name] if self.master is not None else p.detach()
            if self.wd[name] != 0.0:
                w = w * (1.0 - lr_t * self.wd[name])
            w = w - lr_t * (m / bc1) / (torch.sqrt(v / bc2) + s.eps)
            self.m[name], self.v[name] = m, v
            if self.master is not None:
                self.master[name] = w
                p.copy_(w.to(torch.bfloat16).to(p.dtype))
            else:
                p.copy_(w)

    @torch.no_grad()
    def round_params_to_bf16(self) -> None:
        """bf16 write-back of freshly loaded weights: master = loaded value, parameter = bf16(master)."""
        if self.master is None:
            return
        for name, p in self.params.items():
            self.master[name] = p.detach().clone()
            p.copy_(p.to(torch.bfloat16).to(p.dtype))

    def state_dict(self, iteration: int) -> dict[str, Any]:
        state: dict[str, Any] = {"step": iteration, "exp_avg": dict(self.m), "exp_avg_sq": dict(self.v)}
        if self.master is not None:
            state["fp32_from_fp16_params"] = dict(self.master)
        return state

    def load_state_dict(self, state: dict[str, Any], *, where: str) -> int:
        try:
            for name in self.params:
                self.m[name] = state["exp_avg"][name].float().clone()
                self.v[name] = state["exp_avg_sq"][name].float().clone()
                if self.master is not None:
                    self.master[name] = state["fp32_from_fp16_params"][name].float().clone()
            return int(state["step"])
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{where}: the checkpoint's optimizer state is incomplete ({exc}); pass "
                              "--no-load-optim or --finetune to load the weights only") from None


def global_norm(params: dict[str, nn.Parameter]) -> Tensor:
    """The fp32 L2 norm of all gradients (pre-clip; what both frameworks log)."""
    total = torch.zeros((), dtype=torch.float32, device=next(iter(params.values())).device)
    for p in params.values():
        assert p.grad is not None
        total = total + (p.grad * p.grad).sum()
    return torch.sqrt(total)
