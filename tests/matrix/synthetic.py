"""Training logs in the frameworks' formats with chosen losses, step times and memory, for matrix tests and the
matrix benchmark (the same lines the parsers meet in production, through `alignflow.logs.render`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from alignflow.logs.render import megatron_line, mindformers_pynative_line


def losses(steps: int, *, scale: float = 0.0, seed: int = 0) -> list[float]:
    """A decreasing loss curve; `scale` perturbs it by a relative amount (a numerics change)."""
    return [(5.0 - 0.5 * math.log1p(s) + 0.01 * math.sin(s + seed)) * (1 + scale * math.sin(3 * s))
            for s in range(1, steps + 1)]


def megatron_log(curve: Sequence[float], *, ms: float = 100.0, memory_mb: Sequence[float] = (), gbs: int = 4
                 ) -> list[str]:
    """Megatron `training_log` lines (seconds timestamps: printed as they are) and a `report_memory` line per rank."""
    n = len(curve)
    lines = [" successfully loaded checkpoint from /x [ t 1/1, p 1/1 ] at iteration 0"]
    for s, loss in enumerate(curve, 1):
        lines.append(megatron_line(s, n, consumed_samples=gbs * s, elapsed_ms=ms * (1.5 if s <= 2 else 1.0),
                                   lr=1e-3, global_batch_size=gbs, losses={"lm loss": loss, "mtp_1 loss": loss + 0.1},
                                   grad_norm=3.0 + loss / 10, microseconds=False))
        if s == 1:
            lines += [f"[Rank {r}] (after 1 iterations) memory (MB) | allocated: {m / 2:.2f} | max allocated: "
                      f"{m:.2f} | reserved: {m + 2:.2f} | max reserved: {m + 2:.2f}" for r, m in enumerate(memory_mb)]
    return lines


def mindformers_log(curve: Sequence[float], *, ms: int = 100, memory_mb: int | None = None, gbs: int = 4
                    ) -> list[str]:
    """MindFormers PyNative `LossCallback` lines and, with `memory_mb`, MindSpore's statistics at the end."""
    n = len(curve)
    lines = ["All Network parameters are loaded."]
    lines += [mindformers_pynative_line(s, n, loss=loss, step_time_ms=ms, lr=1e-3, grad_norm=3.0 + loss / 10,
                                        consumed_samples=gbs * s, global_batch_size=gbs, mtp_losses=[loss + 0.1])
              for s, loss in enumerate(curve, 1)]
    if memory_mb is not None:
        lines += ["Device HBM memory size: 62432M", "MindSpore Used memory size: 59392M",
                  "MindSpore memory base address: 0", f"Used peak memory usage (without fragments): {memory_mb}M",
                  f"Actual peak memory usage (with fragments): {memory_mb + 2}M"]
    return lines
