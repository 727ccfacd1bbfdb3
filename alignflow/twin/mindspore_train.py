"""The MindSpore twin's entry point, mirroring `run_mindformer.py --config X.yaml --mode 1`.

    python -m alignflow.twin.mindspore_train --config X.yaml --mode 1

Reads a MindFormers PyNative YAML (`mindformers_yaml.py`), trains the twin in PyNative mode (forward, backward
and optimizer compiled with `mindspore.jit` unless `twin.jit: false`: about 9x faster per step on a 2-core CPU,
the same numbers up to fp32 rounding) and
prints what MindFormers 2.1.0 prints: the start marker, the checkpoint-load lines and one G3 `LossCallback`
line per step, with the stdout logger prefix. It writes MindFormers PyNative checkpoints (`ms_checkpoint.py`).

Stricter than MindFormers, on purpose: a load path that does not exist, a data file whose sha256 is not the
declared one, an unknown YAML key, or a checkpoint that lacks network parameters end the run with an error
instead of a warning and a random initialisation.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.errors import AlignflowError, ConfigError
from alignflow.frameworks.dumpfile import DumpRequest, request_from_env
from alignflow.frameworks.mindspore_host import run_host_tasks_inline
from alignflow.twin.faults import Faults, faults_from_env, optimizer_json
from alignflow.twin.memory import (
    MIB,
    MS_MEMORY_STATISTIC,
    mindspore_memory_statistic,
    mindspore_oom_message,
    parse_memory_size,
    twin_memory,
)
from alignflow.twin.mindformers_yaml import MindFormersConfig

WHERE = "mindspore_train"
log = logging.getLogger(__name__)
COUNTER_SUFFIX = ".tokens_per_expert"  # per-step counters: reset, not restored (convert_bf16 drops them)


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    loss: float
    mtp: tuple[float, ...]
    load_balancing: float | None
    grad_norm: float
    lr: float


def _load_weights(net: Any, loaded: Any) -> None:
    import mindspore as ms

    params = {p.name: p for p in net.get_parameters()}
    needed = [n for n in params if not n.endswith(COUNTER_SUFFIX)]
    missing = [n for n in needed if n not in loaded.tensors]
    unused = [n for n in loaded.tensors if n not in params]
    if missing:
        log.info("Network parameters not loaded:", extra={"site": "load_detail"})  # INFO, as MindFormers logs it
        for name in missing:
            log.info(f"  - {name}", extra={"site": "load_detail_name"})
    else:
        log.info("All Network parameters are loaded.", extra={"site": "load"})
    if unused:
        log.info("Checkpoint weights not loaded:", extra={"site": "load_detail"})
        for name in unused:
            log.info(f"  - {name}", extra={"site": "load_detail_name"})
    else:
        log.info("All Checkpoint weights are loaded.", extra={"site": "load"})
    if missing:
        raise ConfigError(f"{WHERE}: the checkpoint in {str(loaded.directory)!r} lacks {len(missing)} network "
                          f"parameter(s) ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); the twin "
                          "does not train a partly initialised model")
    for name, value in loaded.tensors.items():
        if name not in params:
            continue
        if tuple(value.shape) != tuple(params[name].shape):
            raise ConfigError(f"{WHERE}: {name}: checkpoint shape {tuple(value.shape)} differs from the network's "
                              f"{tuple(params[name].shape)}")
        params[name].set_data(value.astype(ms.float32))


@dataclass
class DataParallel:
    """This process's rank among the MindSpore twin's data-parallel ranks under msrun (MindSpore's CPU backend:
    `mindspore.communication.init()` and PyNative `AllReduce` run on the CPU; one process: no group at all).

    As the PyTorch twin's (`torch_parallel`): rank r takes the r-th micro-batch of each `micro_batch x dp` run of
    the step's samples, each micro-batch's loss is scaled by 1 / (micro x dp) and the gradients, losses and router
    counts are summed over the ranks, so every rank steps with the whole global batch's gradient and logs the
    same line."""

    rank: int = 0
    size: int = 1

    @classmethod
    def from_env(cls) -> DataParallel:
        if int(os.environ.get("MS_WORKER_NUM", "1")) <= 1:  # msrun's number of workers
            return cls()
        from mindspore.communication import get_group_size, get_rank, init

        init()
        return cls(get_rank(), get_group_size())

    def sum_grads(self, grads: Any) -> Any:
        if self.size == 1:
            return grads
        from mindspore import ops

        reduce = ops.AllReduce()
        return tuple(reduce(g) for g in grads)

    def sum_array(self, values: Any) -> Any:
        """The float64 sum over the ranks, in rank order. MindSpore's collectives take no float64: each value
        travels as two float32 (x = hi + lo to 2**-48) through AllGather, and the sum is taken here."""
        if self.size == 1:
            return values
        import mindspore as ms
        import numpy as np
        from mindspore import ops

        x = np.asarray(values, dtype=np.float64).reshape(-1)
        hi = x.astype(np.float32)
        lo = (x - hi.astype(np.float64)).astype(np.float32)
        gathered = ops.AllGather()(ms.Tensor(np.stack([hi, lo]).reshape(1, -1))).asnumpy().astype(np.float64)
        parts = gathered.reshape(self.size, 2, -1)
        return (parts[:, 0] + parts[:, 1]).sum(axis=0)


def train(cfg: MindFormersConfig, *, clock: Callable[[], float] = time.perf_counter, faults: Faults | None = None,
          dump: DumpRequest | None = None) -> list[StepRecord]:
    """Run one training described by a validated `MindFormersConfig`; return what was logged per step.

    `faults` injects the seeds' bugs into this side (`twin.faults`); `dump` runs only the requested step, from the
    loaded weights with a fresh optimizer, in PyNative without jit, and dumps it (`twin.ms_dump`). Under msrun the
    ranks are data-parallel (`DataParallel`); rank 0 saves the checkpoint, as one rank's.
    """
    import mindspore as ms
    import numpy as np

    from alignflow.logs.render import mindformers_pynative_line
    from alignflow.twin import logformats as fmt
    from alignflow.twin import ms_checkpoint as ckpt
    from alignflow.twin.data import load_data
    from alignflow.twin.mindformers_yaml import model_config_from_mindformers
    from alignflow.twin.ms_model import TwinGPTMindSpore
    from alignflow.twin.ms_optim import AdamW, add_grads, global_norm
    from alignflow.twin.presets import twin_spec
    from alignflow.twin.schedule import OptimSettings

    faults = faults or Faults()
    tr, cp, mc = cfg.training, cfg.checkpoint, cfg.model.arch
    spec = dataclasses.replace(faults.model(twin_spec(model_config_from_mindformers(cfg))),
                               bias_swiglu_fusion=mc.bias_swiglu_fusion,
                               recompute_num_layers=1 if cfg.recompute.mode == "full" else 0)
    memory = twin_memory(spec, micro_batch_size=tr.local_batch_size, recompute_num_layers=spec.recompute_num_layers,
                         fused_swiglu=spec.bias_swiglu_fusion)
    try:
        capacity = parse_memory_size(cfg.context.max_device_memory)
    except ValueError as exc:
        raise ConfigError(f"{WHERE}: context.max_device_memory: {exc}") from None
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device(cfg.context.device_target)
    ms.set_deterministic(bool(tr.deterministic))
    ms.set_seed(tr.seed)
    np.random.seed(tr.seed)
    dp = DataParallel.from_env()
    log.info("Running MindFormers in PYNATIVE_MODE.", extra={"site": "trainer"})
    gbs, mbs = tr.global_batch_size, tr.local_batch_size
    if gbs % (mbs * dp.size):
        raise ConfigError(f"{WHERE}: training.global_batch_size {gbs} is not a multiple of local_batch_size {mbs} x "
                          f"{dp.size} data-parallel ranks")
    if dump is not None and dp.size > 1:
        raise ConfigError(f"{WHERE}: dumps are taken in one process; run the diagnose step with one NPU rank")
    data = load_data(cfg.data_file, seq_length=spec.seq_length, seed=cfg.train_dataset.dataloader.config.seed,
                     vocab_size=spec.vocab_size, samples_needed=tr.steps * gbs, expected_sha256=cfg.twin.data_sha256,
                     where=WHERE)

    net = TwinGPTMindSpore(spec)
    settings = OptimSettings(schedule=cfg.lr_schedule(), weight_decay=cfg.optimizer.weight_decay,
                             beta1=cfg.optimizer.betas[0], beta2=cfg.optimizer.betas[1], eps=cfg.optimizer.eps,
                             clip_grad=tr.max_norm, bf16_params=mc.params_dtype == "bfloat16")
    settings = faults.optimizer(settings)
    start_step, loaded_opt = 0, None
    if cp.load_path:
        loaded = ckpt.load(Path(cp.load_path), need_optimizer=not cp.no_load_optim, where=WHERE)
        if not cp.no_load_optim:  # MindFormers logs the data skip before loading the weights
            start_step, loaded_opt = int(loaded.common["global_step"]), loaded.optimizer
            log.info(fmt.mindformers_resume_message(
                local_batch_size=mbs, consumed_samples=int(loaded.common.get("consumed_samples") or 0),
                global_step=start_step), extra={"site": "resume"})
        _load_weights(net, loaded)
    optimizer = AdamW(net.trainable_params(), settings)
    if loaded_opt is not None:
        optimizer.load_state(loaded_opt, where=WHERE)
    else:
        optimizer.round_params_to_bf16()
    recorder = None
    last = tr.steps
    if dump is not None:
        from alignflow.twin.ms_dump import MindSporeRecorder

        recorder = MindSporeRecorder(dump, net)
        recorder.loaded(net)
        start_step, last = dump.step - 1, dump.step  # the dumped step, from the loaded weights
    grad_fn = ms.value_and_grad(net, None, net.trainable_params(), has_aux=True)
    norm_fn, update_fn = global_norm, optimizer
    if cfg.twin.jit and recorder is None:  # cell hooks fire in PyNative only
        grad_fn, norm_fn, update_fn = ms.jit(grad_fn), ms.jit(global_norm), ms.jit(optimizer)
    micro = gbs // (mbs * dp.size)
    # MindFormers prints `throughput: %6.2fT` = step FLOPs / (ms * 1e9) from Megatron's FLOPs formula; the twin
    # prints the dense 6 * parameters * tokens estimate (the same 0.00T at the twin's sizes)
    flops = 6.0 * sum(int(np.prod(p.shape)) for p in net.trainable_params()) * gbs * spec.seq_length
    micro_scale = ms.Tensor(1.0 / (micro * dp.size), ms.float32)
    moe_layers = net.moe_layers()
    records: list[StepRecord] = []
    saved: list[Path] = []
    log.info("Start training loop...", extra={"site": "start"})
    if memory.peak > capacity:
        # the CPU has no device to run out of: the twin raises what MindSpore's Ascend allocator raises when a step
        # needs more than max_device_memory (its memory model, alignflow.twin.memory)
        raise RuntimeError(mindspore_oom_message(memory.activations, max_device_memory=capacity, used=memory.static))
    for step in range(start_step + 1, last + 1):
        t0 = clock()
        batch = data.batch(step - 1, gbs)
        grads: Any = None
        lm_sum, mtp, aux, counts = 0.0, np.zeros(spec.mtp_num_layers), None, None
        for i in range(micro):
            start_row = (i * dp.size + dp.rank) * mbs
            rows = batch[start_row : start_row + mbs]
            tokens, labels = ms.Tensor(rows[:, :-1].astype(np.int32)), ms.Tensor(rows[:, 1:].astype(np.int32))
            (_, mb_lm, mb_mtp, mb_aux, mb_counts), mb_grads = grad_fn(tokens, labels, micro_scale)
            grads = mb_grads if grads is None else add_grads(grads, mb_grads)
            lm_sum += float(mb_lm.asnumpy())
            mtp = mtp + mb_mtp.asnumpy().astype(np.float64) / (micro * dp.size)
            aux = mb_aux.asnumpy() / (micro * dp.size) + (0 if aux is None else aux)
            counts = mb_counts.asnumpy() + (0 if counts is None else counts)
            if recorder is not None:
                recorder.stop_forward()
        if dp.size > 1:  # the whole global batch's gradient, losses and router counts on every rank
            grads = dp.sum_grads(grads)
            lm_sum = float(dp.sum_array([lm_sum])[0])
            mtp = dp.sum_array(mtp) if len(mtp) else mtp
            aux = dp.sum_array(aux) if aux is not None else aux
            counts = dp.sum_array(counts).astype(np.float32) if counts is not None else counts
        grads = ms.mutable(grads)  # a tuple of tensors passed to jit must be mutable, or every step recompiles
        norm = float(norm_fn(grads).asnumpy())
        if recorder is not None:
            recorder.grads(net.trainable_params(), grads)
        if math.isfinite(norm):
            clip = settings.clip_coeff(norm)
            bc1, bc2 = settings.bias_corrections(step)
            update_fn(grads, ms.Tensor(settings.schedule(step - 1), ms.float32), ms.Tensor(bc1, ms.float32),
                      ms.Tensor(bc2, ms.float32), ms.Tensor(clip, ms.float32))
            if recorder is not None:
                recorder.updated(net.trainable_params())
                recorder.write(scalars={"lm_loss": lm_sum / (gbs * spec.seq_length), "grad_norm": norm,
                                        "clip_coeff": clip, "lr": settings.schedule(step - 1)},
                               optimizer=optimizer_json(settings))
        else:
            log.warning(fmt.mindformers_nan_message(norm, step), extra={"site": "nan"})
        for layer, layer_counts in zip(moe_layers, counts if counts is not None else [], strict=False):
            _update_router_state(layer, layer_counts, spec)
        elapsed_ms = int((clock() - t0) * 1000)
        lb = None  # MindFormers and Megatron log the load-balancing loss only when an aux loss is active
        if spec.moe is not None and spec.moe.aux_loss_coeff and aux is not None:
            lb = float(np.sum(aux)) / spec.num_moe_layers_for_logging
        record = StepRecord(step, lm_sum / (gbs * spec.seq_length), tuple(float(x) for x in mtp), lb, norm,
                            settings.schedule(step))
        records.append(record)
        log.info(mindformers_pynative_line(
            step, tr.steps, consumed_samples=step * gbs, global_batch_size=gbs, loss=record.loss,
            step_time_ms=elapsed_ms, load_balancing_loss=lb, mtp_losses=record.mtp, lr=record.lr,
            grad_norm=norm if math.isfinite(norm) else None, throughput_tflops=flops / (max(elapsed_ms, 1) * 1e9),
            prefix="none"), extra={"site": "loss"})
        if dp.rank == 0 and cp.enable_save and cp.save_path and (step % cp.save_interleaved_steps == 0 or
                                                                 step == tr.steps):
            model_state = _model_state(net, bf16=settings.bf16_params)
            step_tensor = ckpt.global_step_tensor(step)
            opt_state = None if cp.no_save_optim else [*optimizer.state(), step_tensor]
            ckpt.save(Path(cp.save_path), step, prefix=cp.prefix, model=model_state, optimizer=opt_state,
                               common=ckpt.common_info(step_num=tr.steps, global_step=step, global_batch_size=gbs,
                                                       consumed_samples=step * gbs),
                               save_max=cp.save_max, saved_by_this_run=saved)
            log.info(fmt.mindformers_saved_message(step, str(cp.save_path)), extra={"site": "save"})
    if os.environ.get(MS_MEMORY_STATISTIC) == "1" and recorder is None:
        # MindSpore's statistic block, bare lines at the end of the run's output (its dry-run and tuning guides)
        sys.stdout.write("".join(f"{line}\n" for line in mindspore_memory_statistic(
            memory, max_device_memory_mb=capacity // MIB)))
        sys.stdout.flush()
    return records


def _update_router_state(layer: Any, counts: Any, spec: Any) -> None:
    """Keep the step's routed-token counts; apply Megatron's aux-loss-free bias update (sign of mean - count)."""
    import mindspore as ms
    import numpy as np

    layer.tokens_per_expert.set_data(ms.Tensor(counts.astype(np.float32)))
    if spec.moe.expert_bias:
        offset = np.float32(counts.mean()) - counts.astype(np.float32)
        bias = layer.expert_bias.asnumpy() + np.sign(offset).astype(np.float32) * np.float32(spec.moe.bias_update_rate)
        layer.expert_bias.set_data(ms.Tensor(bias.astype(np.float32)))


def _model_state(net: Any, *, bf16: bool) -> list[dict[str, Any]]:
    """The model file: parameters in their storage dtype (bf16 runs keep fp32 router buffers and counters)."""
    import mindspore as ms

    out = []
    for p in net.get_parameters():
        keep_fp32 = not bf16 or not p.requires_grad
        out.append({"name": p.name, "data": p.value() if keep_fp32 else p.value().astype(ms.bfloat16)})
    return out


def _configure_logging() -> None:
    from alignflow.twin.logformats import MindFormersFormatter, mindformers_logger_name

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(MindFormersFormatter(mindformers_logger_name(os.environ)))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """`run_mindformer.py`-style entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m alignflow.twin.mindspore_train", allow_abbrev=False,
                                     description="The twin's MindSpore side (MindFormers PyNative YAML).")
    parser.add_argument("--config", required=True, help="MindFormers PyNative YAML")
    parser.add_argument("--mode", type=int, default=1, choices=[1], help="1 = PyNative (the only mode)")
    args = parser.parse_args(argv)
    _configure_logging()
    run_host_tasks_inline()  # the twin runs MindSpore on a CPU (alignflow.frameworks.mindspore_host)
    try:
        from alignflow.twin.mindformers_yaml import load_mindformers_config

        train(load_mindformers_config(args.config), faults=faults_from_env(os.environ),
              dump=request_from_env(os.environ))
    except AlignflowError as exc:
        log.error(str(exc), extra={"site": "trainer"})
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
