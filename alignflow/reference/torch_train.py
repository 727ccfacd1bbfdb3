"""The PyTorch twin's entry point, mirroring Megatron-LM `pretrain_gpt.py`.

    python -m alignflow.reference.torch_train <Megatron flags>   (see megatron_flags.py)

Builds the twin from Megatron's model flags, loads a legacy checkpoint like Megatron (its load lines, the
`load_return: None` non-strict fallback on a name mismatch), trains with the shared schedule and the explicit
AdamW, and prints Megatron's `training_log` line per iteration (`--log-interval`, iteration 1 always, losses
averaged over the interval as Megatron does). `--save` writes legacy checkpoints in the chosen flavour.

Stricter than Megatron where a silent failure would only waste an experiment: a missing `--load` directory or
tracker, a data file whose sha256 differs from `--twin-data-sha256`, and unknown flags are errors.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from alignflow.errors import AlignflowError

WHERE = "torch_train"
log = logging.getLogger(__name__)


class _Interval:
    """Megatron's `total_loss_dict`: losses summed over the advanced iterations since the last print."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.advanced = 0

    def add(self, losses: dict[str, float]) -> None:
        for key, value in losses.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.advanced += 1

    def averages(self) -> list[tuple[str, float]]:
        return [(k, v / max(1, self.advanced)) for k, v in self.sums.items()]


def train(ns: argparse.Namespace, *, clock: Callable[[], float] = time.perf_counter,
          now: Callable[[], datetime] = datetime.now) -> list[dict[str, float]]:
    """Run the training a parsed Megatron command line describes; return the per-iteration values."""
    import numpy as np
    import torch

    from alignflow.logs.render import megatron_line
    from alignflow.reference import logformats as fmt
    from alignflow.reference.data import load_data
    from alignflow.reference.flavours import megatron_layout, mtp_inner_name, timestamp_has_microseconds
    from alignflow.reference.megatron_flags import data_file, model_config_from_megatron, padded_vocab_size
    from alignflow.reference.presets import twin_spec
    from alignflow.reference.schedule import LRSchedule, OptimSettings
    from alignflow.reference.torch_checkpoint import load_checkpoint, save_checkpoint
    from alignflow.reference.torch_model import TwinGPTTorch
    from alignflow.reference.torch_optim import AdamW, global_norm

    spec = twin_spec(model_config_from_megatron(ns))
    version = ns.twin_megatron_version
    micros = first_print = timestamp_has_microseconds(version)  # both changed in megatron-core 0.16
    device = torch.device("cuda" if ns.twin_device == "cuda" or (ns.twin_device == "auto"
                                                                  and torch.cuda.is_available()) else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on the GPU too
    torch.backends.cudnn.allow_tf32 = False
    if ns.deterministic_mode:
        # cuBLAS needs a fixed workspace for reproducible GEMMs (read when the first handle is created); ops
        # without a deterministic kernel warn instead of ending the run
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(ns.seed)
    orig_vocab, padded = padded_vocab_size(ns)
    gbs = ns.global_batch_size or ns.micro_batch_size
    data = load_data(data_file(ns), seq_length=spec.seq_length, seed=ns.seed, vocab_size=orig_vocab,
                     samples_needed=ns.train_iters * gbs, expected_sha256=ns.twin_data_sha256, where=WHERE)
    log.info(fmt.megatron_padded_vocab_line(orig_vocab, padded))
    model = TwinGPTTorch(spec, mtp_inner_name=mtp_inner_name(version))
    names = list(model.state_dict())
    layout = megatron_layout(names, ns.transformer_impl, grouped_gemm=ns.moe_grouped_gemm)
    log.info(f" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
             f"{sum(p.numel() for p in model.parameters())}")
    settings = OptimSettings(
        schedule=LRSchedule(max_lr=ns.lr, min_lr=ns.min_lr, warmup_steps=ns.lr_warmup_iters,
                            decay_steps=ns.lr_decay_iters or ns.train_iters, style=ns.lr_decay_style,
                            init_lr=ns.lr_warmup_init),
        weight_decay=ns.weight_decay, beta1=ns.adam_beta1, beta2=ns.adam_beta2, eps=ns.adam_eps,
        clip_grad=ns.clip_grad, bf16_params=ns.bf16)
    iteration, opt_state = 0, None
    if ns.load:
        result = load_checkpoint(model, Path(ns.load), layout, finetune=ns.finetune, where=WHERE)
        iteration = result.iteration
        if not ns.finetune and not ns.no_load_optim and not result.release:
            if result.optimizer is None:
                raise _no_optimizer(ns.load)
            opt_state = result.optimizer
    model.to(device)
    optimizer = AdamW(model, settings)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state, where=WHERE)
    else:
        optimizer.round_params_to_bf16()
    log.info("training ...")
    micro = gbs // ns.micro_batch_size
    moe_layers = model.moe_layers()
    interval, skipped, nans, out = _Interval(), 0, 0, []
    t_interval, iters_in_interval = clock(), 0
    for it in range(iteration + 1, ns.train_iters + 1):
        model.zero_grad(set_to_none=True)
        batch = torch.from_numpy(data.batch(it - 1, gbs)).to(device)
        lm_sum, mtp = 0.0, np.zeros(spec.mtp_num_layers)
        aux = np.zeros(len(moe_layers))
        counts = [torch.zeros(spec.moe.num_experts, device=device) for _ in moe_layers] if spec.moe else []
        for i in range(micro):
            rows = batch[i * ns.micro_batch_size : (i + 1) * ns.micro_batch_size]
            outputs = model(rows[:, :-1], rows[:, 1:], 1.0 / micro)
            outputs.objective.backward()
            lm_sum += float(outputs.lm_sum)
            mtp += np.array([float(x) for x in outputs.mtp_means]) / micro
            aux += np.array([float(x) for x in outputs.aux_raw]) / micro
            counts = [c + mc for c, mc in zip(counts, outputs.counts, strict=True)]
        norm = float(global_norm(optimizer.params))
        if math.isfinite(norm):
            clip = settings.clip_coeff(norm)
            optimizer.step(settings.schedule(it - 1), it, clip)
            losses = {"lm loss": lm_sum / (gbs * spec.seq_length)}
            if spec.moe is not None and spec.moe.aux_loss_coeff:
                losses["load_balancing_loss"] = float(aux.sum()) / spec.num_moe_layers_for_logging
            losses |= {f"mtp_{k + 1} loss": float(v) for k, v in enumerate(mtp)}
            interval.add(losses)
        else:
            skipped, nans = skipped + 1, nans + 1
        model.update_expert_bias(counts)
        iters_in_interval += 1
        out.append({"iteration": it, "grad_norm": norm, "lr": settings.schedule(it), **dict(interval.averages())})
        # megatron-core >= 0.16 also prints the first iteration but does not reset its accumulators then, so
        # the next line averages the first interval including iteration 1 (with --log-interval 1: iteration 2
        # shows the mean of iterations 1 and 2), as training.py's `should_reset = not is_first_iteration`.
        first = first_print and it == iteration + 1
        if it % ns.log_interval == 0 or first:
            elapsed = (clock() - t_interval) * 1000.0 / iters_in_interval
            log.info(megatron_line(
                it, ns.train_iters, when=now(), microseconds=micros, consumed_samples=it * gbs,
                elapsed_ms=elapsed, lr=settings.schedule(it), global_batch_size=gbs, losses=dict(interval.averages()),
                grad_norm=norm if math.isfinite(norm) else None, skipped=skipped, nan_iterations=nans))
            if not first:
                interval, skipped, nans = _Interval(), 0, 0
                t_interval, iters_in_interval = clock(), 0
        if ns.save and (it == ns.train_iters or (ns.save_interval and it % ns.save_interval == 0)):
            model.to("cpu")
            save_checkpoint(model, Path(ns.save), it, layout, microseconds=micros, now=now,
                            optimizer=None if ns.no_save_optim else _cpu(optimizer.state_dict(it)))
            model.to(device)
    log.info(f"[after training is done] datetime: {now().strftime('%Y-%m-%d %H:%M:%S')}")
    return out


def _cpu(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    return value.detach().cpu().clone() if hasattr(value, "detach") else value


def _no_optimizer(load: str) -> AlignflowError:
    from alignflow.errors import ConfigError

    return ConfigError(f"{WHERE}: Unable to load optimizer from checkpoint {load}. Specify --no-load-optim or "
                       "--finetune to prevent attempting to load the optimizer state")


def main(argv: Sequence[str] | None = None) -> int:
    """`pretrain_gpt.py`-style entry point; returns the process exit code."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))  # Megatron prints plain lines
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    for name in ("alignflow.reference.torch_checkpoint",):
        child = logging.getLogger(name)
        child.handlers[:] = [handler]
        child.setLevel(logging.INFO)
        child.propagate = False
    from alignflow.reference.megatron_flags import parse_megatron_args

    try:
        train(parse_megatron_args(sys.argv[1:] if argv is None else argv))
    except AlignflowError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
