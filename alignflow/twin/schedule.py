"""Optimisation settings shared by both sides: the learning-rate schedule and the AdamW hyper-parameters.

The schedule is Megatron's `OptimizerParamScheduler.get_lr` (linear warm-up from `init_lr`, then constant,
linear or cosine decay to `min_lr`), evaluated at the number of updates already done: update `k` (1-based)
uses `lr(k - 1)`, and both frameworks print `lr(k)` on the step-`k` line (Megatron reads the scheduler after
its step; MindFormers' LossCallback evaluates the scheduler after `global_step += 1`,
docs/mindformers.md#step-numbering-and-the-printed-learning-rate).
MindFormers' `ConstantWarmUpLR` / `LinearWithWarmUpLR` / `CosineWithWarmUpLR` follow the same formulas.

The AdamW update itself is written out on each side in that side's framework (`torch_train.py`,
`mindspore_train.py`), term by term in the same order — the seeds' GPU-side fix
(docs/seeds.md#glm-52-problems-and-fixes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

DecayStyle = Literal["constant", "linear", "cosine"]
CLIP_EPS = 1.0e-6  # Megatron clip_grad_by_total_norm_fp32: clip_coeff = max_norm / (total_norm + 1e-6)


@dataclass(frozen=True, slots=True)
class LRSchedule:
    """Megatron's learning-rate schedule (`lr_warmup_init` -> `max_lr` -> `min_lr`)."""

    max_lr: float
    min_lr: float
    warmup_steps: int
    decay_steps: int
    style: DecayStyle
    init_lr: float = 0.0

    def __call__(self, num_steps: int) -> float:
        """The learning rate after `num_steps` optimizer updates."""
        if self.warmup_steps > 0 and num_steps <= self.warmup_steps:
            return self.init_lr + (self.max_lr - self.init_lr) * float(num_steps) / float(self.warmup_steps)
        if self.style == "constant":
            return self.max_lr
        if num_steps > self.decay_steps:
            return self.min_lr
        ratio = float(num_steps - self.warmup_steps) / float(self.decay_steps - self.warmup_steps)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)


@dataclass(frozen=True, slots=True)
class OptimSettings:
    """AdamW, clipping and parameter storage, identical on both sides."""

    schedule: LRSchedule
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    clip_grad: float  # 0 = no clipping
    bf16_params: bool  # round the parameters to bf16 after every update (fp32 master copy kept)

    def clip_coeff(self, norm: float) -> float:
        """The factor the gradients are scaled by (Megatron: `max_norm / (total_norm + 1e-6)`, capped at 1)."""
        return min(1.0, self.clip_grad / (norm + CLIP_EPS)) if self.clip_grad > 0 else 1.0

    def bias_corrections(self, step: int) -> tuple[float, float]:
        """`1 - beta^t` for update `t` (1-based), computed in Python float64 on both sides."""
        return 1.0 - self.beta1**step, 1.0 - self.beta2**step


def decays(name: str, ndim: int) -> bool:
    """Weight decay applies to matrices only: Megatron's default param groups exclude biases and 1-D tensors."""
    return ndim > 1 and not name.endswith(".bias")
