"""Training runs as data, and their logs written with the frameworks' own format strings.

The lines come from `alignflow.logs.render`, which reproduces the reference lines byte for byte
(tests/logs/test_render.py), so every parser and comparison test here runs on real-format logs. `printed()`
gives the values exactly as a log holds them, for computing expected statistics independently of the parser.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from alignflow.logs.render import megatron_line, mindformers_legacy_line, mindformers_pynative_line

T0 = datetime(2026, 8, 20, 10, 15, 2, 118000)


@dataclass(frozen=True)
class Run:
    """Per-step values of one training run (index i is step steps[i])."""

    steps: list[int]
    lm_loss: list[float]
    grad_norm: list[float]
    lr: list[float]
    step_time_ms: list[float]
    mtp: list[list[float]] = field(default_factory=list)  # one list per depth
    load_balancing: list[float] | None = None
    global_batch_size: int = 8

    @property
    def n(self) -> int:
        return len(self.steps)


def make_run(n: int, *, seed: int = 0, start: int = 1, mtp_depths: int = 1, moe: bool = True,
             step_time_ms: float = 700.0) -> Run:
    """A plausible decreasing loss curve with a warm-up lr schedule."""
    rng = random.Random(seed)
    steps = list(range(start, start + n))
    lm = [2.0 + 9.0 * math.exp(-s / 150.0) + rng.uniform(-0.05, 0.05) for s in steps]
    return Run(
        steps=steps, lm_loss=lm, grad_norm=[1.0 + 2.0 * math.exp(-s / 80.0) + rng.uniform(0, 0.3) for s in steps],
        lr=[1e-4 * min(1.0, s / 10.0) for s in steps],
        step_time_ms=[step_time_ms + rng.uniform(-20, 20) + (5000.0 if s == start else 0.0) for s in steps],
        mtp=[[v + 0.1 * (k + 1) for v in lm] for k in range(mtp_depths)],
        load_balancing=[1.0 + rng.uniform(-0.01, 0.01) for _ in steps] if moe else None,
    )


def perturbed(run: Run, *, loss_noise: float = 0.0, grad_noise: float = 0.0, seed: int = 1,
              loss_offset: float = 0.0, time_scale: float = 1.0) -> Run:
    """The same run as seen by another framework: small per-step differences."""
    rng = random.Random(seed)
    return replace(
        run,
        lm_loss=[v + loss_offset + rng.gauss(0, loss_noise) for v in run.lm_loss],
        grad_norm=[v + rng.gauss(0, grad_noise) for v in run.grad_norm],
        mtp=[[v + loss_offset + rng.gauss(0, loss_noise) for v in depth] for depth in run.mtp],
        step_time_ms=[t * time_scale for t in run.step_time_ms],
    )


def mindformers_lines(run: Run, *, generation: int = 3, prefix: str = "stdout", max_steps: int | None = None,
                      lr_lead: int = 1, mtp: bool = True) -> list[str]:
    """PyNative LossCallback lines. MindFormers prints the next step's lr (`lr_lead=1`)."""
    total = max_steps or run.steps[-1]
    out = []
    for i, s in enumerate(run.steps):
        lr = 1e-4 * min(1.0, (s + lr_lead) / 10.0)
        out.append(mindformers_pynative_line(
            s, total, loss=run.lm_loss[i], step_time_ms=round(run.step_time_ms[i]), lr=lr,
            grad_norm=run.grad_norm[i], consumed_samples=s * run.global_batch_size,
            global_batch_size=run.global_batch_size,
            load_balancing_loss=run.load_balancing[i] if run.load_balancing else None,
            mtp_losses=[d[i] for d in run.mtp] if mtp else (), throughput_tflops=1.36,
            generation=generation,  # type: ignore[arg-type]
            prefix=prefix,  # type: ignore[arg-type]
            when=T0 + timedelta(milliseconds=sum(run.step_time_ms[: i + 1])),
        ) + "\n")
    return out


def legacy_lines(run: Run, *, steps_per_epoch: int | None = None, sink: bool = True,
                 separate: bool = True) -> list[str]:
    """Legacy MFLossMonitor lines; the printed `loss` is the total (lm + aux + scaled MTP)."""
    spe = steps_per_epoch or run.steps[-1]
    epochs = math.ceil(run.steps[-1] / spe)
    out = []
    for i, s in enumerate(run.steps):
        lb = run.load_balancing[i] if run.load_balancing else None
        mtp_scaled = 0.3 * run.mtp[0][i] if run.mtp else None
        total = run.lm_loss[i] + (0.001 * lb if lb else 0.0) + (mtp_scaled or 0.0)
        epoch, in_epoch = (s - 1) // spe + 1, (s - 1) % spe + 1
        out.append(mindformers_legacy_line(
            epoch, epochs, in_epoch, spe, loss=total, loss_avg=None if sink else total + 0.5,
            lm_loss=run.lm_loss[i] if separate else None, load_balancing_loss=lb if separate else None,
            mtp_loss=mtp_scaled if separate else None, step_time_ms=round(run.step_time_ms[i]), lr=run.lr[i],
            global_norm=run.grad_norm[i], throughput_tflops=1.36) + "\n")
    return out


def megatron_lines(run: Run, *, rank_prefix: str = "", microseconds: bool = True, max_steps: int | None = None,
                   extra_losses: dict[str, list[float]] | None = None, mtp: bool = True,
                   first_interval_averaged: bool | None = None) -> list[str]:
    """Megatron training_log lines (log-interval 1), as the version the timestamps show prints them.

    megatron-core >= 0.16 (microsecond timestamps) does not reset its loss averages after the first printed
    iteration, so its second line prints the mean of the first two iterations' losses; `first_interval_averaged`
    overrides what the timestamps imply.
    """
    averaged = microseconds if first_interval_averaged is None else first_interval_averaged
    total = max_steps or run.steps[-1]
    out = []
    for i, s in enumerate(run.steps):
        series = {"lm loss": run.lm_loss}
        if run.load_balancing:
            series["load_balancing_loss"] = run.load_balancing
        series.update(extra_losses or {})
        if mtp:
            series |= {f"mtp_{k} loss": depth for k, depth in enumerate(run.mtp, 1)}
        losses = {name: (values[0] + values[1]) / 2 if averaged and i == 1 else values[i]
                  for name, values in series.items()}
        out.append(megatron_line(
            s, total, consumed_samples=s * run.global_batch_size, elapsed_ms=run.step_time_ms[i], lr=run.lr[i],
            global_batch_size=run.global_batch_size, losses=losses, grad_norm=run.grad_norm[i],
            when=T0 + timedelta(milliseconds=sum(run.step_time_ms[: i + 1])), microseconds=microseconds,
            rank_prefix=rank_prefix) + "\n")
    return out


def printed_mf(values: Sequence[float]) -> list[float]:
    """Values as MindFormers PyNative prints them (`%10.6f`)."""
    return [float(f"{v:10.6f}") for v in values]


def printed_mg_loss(values: Sequence[float]) -> list[float]:
    """Losses as Megatron prints them (`{:.6E}`)."""
    return [float(f"{v:.6E}") for v in values]


def recovered_mg_loss(values: Sequence[float]) -> list[float]:
    """Losses as the parser recovers them from a megatron-core >= 0.16 log: printed, and step 2 (printed as the
    mean of steps 1 and 2) taken back as `2 * printed(mean) - printed(step 1)`."""
    out = printed_mg_loss(values)
    if len(out) > 1:
        out[1] = 2 * float(f"{(values[0] + values[1]) / 2:.6E}") - out[0]
    return out


def printed_mg_norm(values: Sequence[float]) -> list[float]:
    """Grad norms as Megatron prints them (`{:.3f}`)."""
    return [float(f"{v:.3f}") for v in values]


def write(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("".join(lines), encoding="utf-8")
    return path


BANNER = ["training ...\n", "[before the start of training step] datetime: 2026-08-20 10:15:01\n"]


def training_log(iterations: Sequence[dict[str, float]], *, start: int = 0, log_interval: int = 1,
                 core_016: bool = True, timestamp: bool = True, skipped: Collection[int] = (),
                 train_iters: int | None = None, banner: bool = True) -> list[str]:
    """One Megatron process's log: `training_log`'s accumulator rules applied to known per-iteration losses.

    `iterations[i]` holds the losses (printed names) of iteration `start + 1 + i`. Like `training.py`, losses of
    advanced iterations are summed and printed as their mean over the advanced iterations since the last reset;
    a skipped iteration adds nothing but the skipped counter (and the nan counter when a loss is not finite).
    megatron-core >= 0.16 (`core_016`) also prints the process's first iteration and does not reset after it;
    0.8-0.15 print only on `iteration % log_interval == 0`. `banner` writes the lines a process prints before
    training (and the checkpoint-load line when `start > 0`).
    """
    total = train_iters or start + len(iterations)
    out = []
    if banner:
        if start:
            out.append(f"  successfully loaded checkpoint from ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration "
                       f"{start}\n")
        out += BANNER
    sums: dict[str, float] = {}
    advanced = n_skipped = n_nan = 0
    first = True
    for i, losses in enumerate(iterations):
        it = start + 1 + i
        if it in skipped:
            n_skipped += 1
            n_nan += int(not all(math.isfinite(v) for v in losses.values()))
        else:
            advanced += 1
            for key, value in losses.items():
                sums[key] = sums.get(key, 0.0) + value
        if it % log_interval == 0 or (core_016 and first):
            out.append(megatron_line(
                it, total, consumed_samples=4 * it, elapsed_ms=500.0, lr=1e-4 * it / total, global_batch_size=4,
                losses={k: v / max(1, advanced) for k, v in sums.items()}, grad_norm=1.0 + it / 1000,
                skipped=n_skipped, nan_iterations=n_nan, microseconds=core_016,
                when=T0 + timedelta(seconds=it) if timestamp else None) + "\n")
            if not (core_016 and first):
                sums = dict.fromkeys(sums, 0.0)
                advanced = n_skipped = n_nan = 0
        first = False
    return out
