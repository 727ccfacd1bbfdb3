"""The PyTorch twin's entry point, mirroring Megatron-LM `pretrain_gpt.py`.

    python -m alignflow.twin.torch_train <Megatron flags>   (see megatron_flags.py)

Builds the twin from Megatron's model flags, loads a legacy checkpoint like Megatron (its load lines, the
`load_return: None` non-strict fallback on a name mismatch), trains with the shared schedule and the explicit
AdamW, and prints Megatron's `training_log` line per iteration (`--log-interval`, iteration 1 always, losses
averaged over the interval as Megatron does). `--save` writes legacy checkpoints in the chosen flavour.

Stricter than Megatron where a silent failure would only waste an experiment: a missing `--load` directory or
tracker, data whose sha256 differs from ALIGNFLOW_TWIN_DATA_SHA256, and unknown flags are errors — and so is a
flag the mimicked megatron-core version's own parser would refuse (its flag table,
`alignflow.frameworks.megatron_lm`): the command line that trains the twin is one real Megatron-LM accepts. The
twin's own settings come from the environment (`alignflow.twin.render.twin_env`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from alignflow.errors import AlignflowError
from alignflow.frameworks.dumpfile import DumpRequest, request_from_env
from alignflow.twin.faults import Faults, faults_from_env, optimizer_json

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


@dataclass(frozen=True, slots=True)
class TwinSettings:
    """The twin's own settings (no Megatron flags): from ALIGNFLOW_TWIN_* in the environment."""

    megatron_version: str = "0.16"
    data_sha256: str | None = None
    device: str = "auto"
    device_memory_mb: int | None = None  # the device's capacity (twin.render.TWIN_DEVICE_MEMORY); None: unlimited

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TwinSettings:
        from alignflow.errors import ConfigError
        from alignflow.twin.render import TWIN_DATA_SHA256, TWIN_DEVICE, TWIN_DEVICE_MEMORY, TWIN_MEGATRON_VERSION

        device = env.get(TWIN_DEVICE, "auto")
        if device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"{WHERE}: {TWIN_DEVICE}={device!r}: expected auto, cpu or cuda")
        capacity = env.get(TWIN_DEVICE_MEMORY)
        if capacity is not None and not (capacity.isdigit() and int(capacity) > 0):
            raise ConfigError(f"{WHERE}: {TWIN_DEVICE_MEMORY}={capacity!r}: expected a positive number of MiB")
        return cls(env.get(TWIN_MEGATRON_VERSION, "0.16"), env.get(TWIN_DATA_SHA256) or None, device,
                   int(capacity) if capacity is not None else None)


def _deterministic_eager_kernels(torch: Any) -> None:
    """`torch.use_deterministic_algorithms(True, warn_only=True)` for the eager kernels the twin runs.

    The public call also sets `torch._inductor.config.deterministic`, for `torch.compile`d graphs, which the twin
    never builds; importing that config imports inductor and dynamo, 1.35 s of the twin's 3.3 CPU-s on the 2-core
    machine (cProfile of an 8-step run). The eager flag is the same either way."""
    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None:  # a torch without it: the public call
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        set_flag(True, warn_only=True)


def train(ns: argparse.Namespace, twin: TwinSettings | None = None, *,
          clock: Callable[[], float] = time.perf_counter, now: Callable[[], datetime] = datetime.now,
          faults: Faults | None = None, dump: DumpRequest | None = None) -> list[dict[str, float]]:
    """Run the training a parsed Megatron command line describes (`twin`: the twin's own settings, from its
    environment); return the per-iteration values.

    `faults` injects the seeds' bugs into this side (`twin.faults`); `dump` runs only the requested step, from the
    loaded weights with a fresh optimizer, and dumps it (`twin.torch_dump`, for `alignflow diagnose`).
    """
    import numpy as np
    import torch

    from alignflow.logs.render import megatron_line
    from alignflow.twin import logformats as fmt
    from alignflow.twin.data import load_data
    from alignflow.twin.flavours import megatron_layout, mtp_inner_name, timestamp_has_microseconds
    from alignflow.twin.megatron_flags import data_file, model_config_from_megatron, padded_vocab_size
    from alignflow.twin.presets import twin_spec
    from alignflow.twin.schedule import LRSchedule, OptimSettings
    from alignflow.twin.torch_checkpoint import RankPlace, load_checkpoint, read_tracker, save_checkpoint
    from alignflow.twin.torch_model import TwinGPTTorch
    from alignflow.twin.torch_optim import AdamW
    from alignflow.twin.torch_parallel import ParallelState

    twin = twin or TwinSettings()
    version = twin.megatron_version
    faults = faults or Faults()
    model_config = model_config_from_megatron(ns, megatron_version=version)
    spec = faults.model(twin_spec(model_config))
    spec = dataclasses.replace(
        spec, bias_swiglu_fusion=not ns.no_bias_swiglu_fusion,
        recompute_num_layers=(ns.recompute_num_layers or 1) if ns.recompute_granularity == "full" else 0)
    micros = first_print = timestamp_has_microseconds(version)  # both changed in megatron-core 0.16
    device = torch.device("cuda" if twin.device == "cuda" or (twin.device == "auto"
                                                               and torch.cuda.is_available()) else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on the GPU too
    torch.backends.cudnn.allow_tf32 = False
    if ns.deterministic_mode:
        # cuBLAS needs a fixed workspace for reproducible GEMMs (read when the first handle is created); ops
        # without a deterministic kernel warn instead of ending the run
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        _deterministic_eager_kernels(torch)
    torch.manual_seed(ns.seed)
    try:
        dp = ParallelState.from_env(tp=ns.tensor_model_parallel_size, pp=ns.pipeline_model_parallel_size,
                                    cuda=device.type == "cuda")
    except ValueError as exc:
        from alignflow.errors import ConfigError

        raise ConfigError(f"{WHERE}: {exc}") from None
    info0 = log.info if dp.first else _quiet  # Megatron's print_rank_0 ...
    info_last = log.info if dp.last else _quiet  # ... and print_rank_last (the iteration lines)
    if not dp.first:
        logging.getLogger("alignflow.twin.torch_checkpoint").setLevel(logging.WARNING)
    orig_vocab, padded = padded_vocab_size(ns, version)
    gbs = ns.global_batch_size or ns.micro_batch_size
    data = load_data(data_file(ns), seq_length=spec.seq_length, seed=ns.seed, vocab_size=orig_vocab,
                     samples_needed=ns.train_iters * gbs, expected_sha256=twin.data_sha256, where=WHERE)
    info0(fmt.megatron_padded_vocab_line(orig_vocab, padded))
    model = TwinGPTTorch(spec, mtp_inner_name=mtp_inner_name(version), tp=dp.tp, stage=dp.pp_rank,
                         stages=dp.pp_size)
    names = list(model.state_dict())
    layout = megatron_layout(names, ns.transformer_impl, grouped_gemm=ns.moe_grouped_gemm)
    place = RankPlace(dp.tp.rank, dp.pp_rank, dp.tp.size, dp.pp_size)
    info0(f" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
             f"{sum(p.numel() for p in model.parameters())}")
    settings = OptimSettings(
        schedule=LRSchedule(max_lr=ns.lr, min_lr=ns.min_lr, warmup_steps=ns.lr_warmup_iters,
                            decay_steps=ns.lr_decay_iters or ns.train_iters, style=ns.lr_decay_style,
                            init_lr=ns.lr_warmup_init),
        weight_decay=ns.weight_decay, beta1=ns.adam_beta1, beta2=ns.adam_beta2, eps=ns.adam_eps,
        clip_grad=ns.clip_grad, bf16_params=ns.bf16)
    settings = faults.optimizer(settings)
    iteration, opt_state = 0, None
    memory = _Memory(spec, ns, twin, device, reports=dp.dp_rank == 0, rank=dp.rank)
    if ns.load:
        memory.loaded_iteration = read_tracker(Path(ns.load), where=WHERE)[0]
        result = load_checkpoint(model, Path(ns.load), layout, finetune=ns.finetune, where=WHERE, place=place,
                                 ckpt_format=ns.ckpt_format,
                                 dist_layout=lambda: _rank_layout(model_config, dp))
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
    recorder = None
    last = ns.train_iters
    if dump is not None and dp.world > 1:
        from alignflow.errors import ConfigError

        raise ConfigError(f"{WHERE}: dumps are taken in one process; run the diagnose step with one GPU rank (dp 1)")
    if dump is not None:
        from alignflow.twin.torch_dump import TorchRecorder

        recorder = TorchRecorder(dump, model)
        recorder.loaded(model)
        iteration, last = dump.step - 1, dump.step  # the dumped step, from the loaded weights
    info0("training ...")
    try:
        micro = dp.micro_batches(gbs, ns.micro_batch_size)
    except ValueError as exc:
        from alignflow.errors import ConfigError

        raise ConfigError(f"{WHERE}: {exc}") from None
    scale = 1.0 / (micro * dp.dp_size)  # of each micro-batch's loss: the gradients are then summed over the ranks
    moe_layers = model.moe_layers()
    positions = model.moe_positions()  # where this stage's MoE layers are among the whole model's
    n_moe = spec.num_moe_layers_for_logging
    n_mtp = spec.mtp_num_layers
    interval, skipped, nans, out = _Interval(), 0, 0, []
    t_interval, iters_in_interval = clock(), 0
    for it in range(iteration + 1, last + 1):
        model.zero_grad(set_to_none=True)
        batch = torch.from_numpy(data.batch(it - 1, gbs)).to(device)
        lm_sum, mtp = 0.0, np.zeros(n_mtp)
        aux = np.zeros(n_moe)  # every MoE layer of the model; this stage fills its own
        counts = [torch.zeros(spec.moe.num_experts, device=device) for _ in moe_layers] if spec.moe else []
        memory.check_capacity()
        for i in range(micro):
            rows = dp.rows(batch, i, ns.micro_batch_size)
            outputs, aux_raw, micro_counts = run_micro_batch(model, dp, rows, scale)
            if outputs is not None:
                lm_sum += float(outputs.lm_sum)
                mtp += np.array([float(x) for x in outputs.mtp_means]) / (micro * dp.dp_size)
            if aux_raw:
                aux[positions] += np.array([float(x) for x in aux_raw]) / (micro * dp.dp_size)
            counts = [c + mc for c, mc in zip(counts, micro_counts, strict=True)]
            if recorder is not None:
                recorder.stop_forward()
        sum_gradients(model, dp)  # over data-parallel replicas; the first and last stage's embedding copies
        if dp.world > 1:
            # every rank ends with the step's values: the losses are the last stage's, the aux losses each stage's
            # own layers', and each is held by every tensor-parallel rank alike (hence / tp)
            summed = dp.sum_floats([lm_sum, *mtp, *aux], None)
            lm_sum = summed[0] / dp.tp.size
            mtp = np.array(summed[1:1 + n_mtp]) / dp.tp.size
            aux = np.array(summed[1 + n_mtp:]) / dp.tp.size
            dp.all_reduce(counts, dp.dp_group)
        norm = gradient_norm(optimizer.params, dp)
        if recorder is not None:
            recorder.grads(model)
        if math.isfinite(norm):
            clip = settings.clip_coeff(norm)
            optimizer.step(settings.schedule(it - 1), it, clip)
            if recorder is not None:
                recorder.updated(model)
                recorder.write(scalars={"lm_loss": lm_sum / (gbs * spec.seq_length), "grad_norm": norm,
                                        "clip_coeff": clip, "lr": settings.schedule(it - 1)},
                               optimizer=optimizer_json(settings))
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
            info_last(megatron_line(
                it, ns.train_iters, when=now(), microseconds=micros, consumed_samples=it * gbs,
                elapsed_ms=elapsed, lr=settings.schedule(it), global_batch_size=gbs, losses=dict(interval.averages()),
                grad_norm=norm if math.isfinite(norm) else None, skipped=skipped, nan_iterations=nans))
            memory.report(it, optimizer)
            if not first:
                interval, skipped, nans = _Interval(), 0, 0
                t_interval, iters_in_interval = clock(), 0
        if ns.save and (it == ns.train_iters or (ns.save_interval and it % ns.save_interval == 0)):
            if dp.dp_rank == 0:  # one file per (tensor, pipeline) rank, as Megatron-LM's legacy format
                model.to("cpu")
                save_checkpoint(model, Path(ns.save), it, layout, microseconds=micros, now=now,
                                optimizer=None if ns.no_save_optim else _cpu(optimizer.state_dict(it)),
                                place=place, tracker=dp.world == 1)
                model.to(device)
            if dp.world > 1:
                dp.barrier()
                if dp.first:
                    from alignflow.convert.layout import TRACKER, write_atomic

                    write_atomic(Path(ns.save) / TRACKER, str(it))
    info0(f"[after training is done] datetime: {now().strftime('%Y-%m-%d %H:%M:%S')}")
    dp.close()
    return out


class _Memory:
    """Megatron's memory reporting of one rank (`report_memory`, docs/megatron.md#memory-report-line), by every
    rank of data-parallel rank 0 in `logformats.megatron_memory_line`'s format: megatron-core 0.19 (`{:.2f}`)
    after the first printed iterations (`training_log`: while `iteration <= loaded iteration + 1`, then once
    more); before 0.19 (`{}`) once, after the first printed iteration (`report_memory_flag`).

    On CUDA the figures are the caching allocator's, exactly what `report_memory` prints. On a CPU no allocator
    keeps them (a stand-in for what cannot exist here): allocated is the bytes of the rank's training state
    (parameters, gradients, Adam moments, fp32 master copies: what the layout divides among the ranks), max
    allocated that plus the activations of one micro-batch as the twin's allocator model counts them
    (`alignflow.twin.memory`: what recomputation, the fused SwiGLU and the micro-batch size change), reserved and
    max reserved the process's resident set now and at its peak (`getrusage`). With a device capacity
    (`TwinSettings.device_memory_mb`) a modelled peak beyond it ends the run with torch's OOM error."""

    def __init__(self, spec: Any, ns: argparse.Namespace, twin: TwinSettings, device: Any, *, reports: bool,
                 rank: int) -> None:
        from alignflow.twin.flavours import parse_version
        from alignflow.twin.memory import twin_memory

        self.model = twin_memory(spec, micro_batch_size=ns.micro_batch_size,
                                 recompute_num_layers=spec.recompute_num_layers,
                                 fused_swiglu=spec.bias_swiglu_fusion)
        self.device = device
        self.cuda = device.type == "cuda"
        self.capacity = twin.device_memory_mb * 1024 * 1024 if twin.device_memory_mb else None
        self.reports, self.rank = reports, rank
        self.core_0_19 = parse_version(twin.megatron_version) >= (0, 19)
        self.loaded_iteration = 0
        self.reporting = True

    def check_capacity(self) -> None:
        """On a CPU with a capacity: torch's out-of-memory error when the step's peak would not fit."""
        if self.cuda or self.capacity is None or self.model.peak <= self.capacity:
            return
        import torch

        from alignflow.twin.memory import torch_oom_message

        # the twin stands in for a CUDA device here: the error is the one torch's caching allocator raises
        raise torch.OutOfMemoryError(torch_oom_message(self.model.activations, capacity=self.capacity,
                                                       allocated=self.model.static))

    def report(self, iteration: int, optimizer: Any) -> None:
        if not self.reporting:
            return
        if iteration > self.loaded_iteration + 1 or not self.core_0_19:
            self.reporting = False
        if not self.reports:
            return
        from alignflow.twin import logformats as fmt

        figures = memory_mib(optimizer, self.device)
        if not self.cuda:
            figures["max_allocated"] = figures["allocated"] + self.model.activations / MIB
        log.info(fmt.megatron_memory_line(self.rank, iteration, **figures, two_decimals=self.core_0_19))


def memory_mib(optimizer: Any, device: Any) -> dict[str, float]:
    """This rank's memory for Megatron's report line, in MiB (see `_Memory`): on CUDA the caching allocator's
    figures; on CPU the training state's bytes (allocated and max allocated) and the resident set (reserved, max
    reserved)."""
    import resource

    import torch

    if device.type == "cuda":
        return {"allocated": torch.cuda.memory_allocated() / MIB, "max_allocated": torch.cuda.max_memory_allocated()
                / MIB, "reserved": torch.cuda.memory_reserved() / MIB,
                "max_reserved": torch.cuda.max_memory_reserved() / MIB}
    tensors = [*optimizer.params.values(), *(p.grad for p in optimizer.params.values() if p.grad is not None),
               *optimizer.m.values(), *optimizer.v.values(), *(optimizer.master or {}).values()]
    state = sum(t.numel() * t.element_size() for t in tensors) / MIB
    with open("/proc/self/statm", encoding="ascii") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    return {"allocated": state, "max_allocated": state, "reserved": rss, "max_reserved": max(peak, rss)}


MIB = 1024.0 * 1024.0


def run_micro_batch(model: Any, ps: Any, rows: Any, scale: float) -> tuple[Any, list[Any], list[Any]]:
    """Forward and backward of one micro-batch on this rank: the whole model, or this pipeline stage's part with
    the hidden states and their gradients passed between stages. Returns the last stage's outputs (None on other
    stages), this stage's aux losses and router counts."""
    import torch

    tokens, labels = rows[:, :-1], rows[:, 1:]
    if ps.pp_size == 1:
        outputs = model(tokens, labels, scale)
        outputs.objective.backward()
        return outputs, outputs.aux_raw, outputs.counts
    moe_out: list[Any] = []
    hidden_in = None
    if not model.first_stage:
        like = torch.empty(*tokens.shape, model.spec.hidden_size, device=tokens.device)
        hidden_in = ps.recv_prev(like).requires_grad_()
    hidden = model.stage_forward(tokens, hidden_in, moe_out)
    moe_out = list(moe_out)  # the forward's entries: a recomputing backward appends its own to the list it was given
    outputs = None
    if model.last_stage:
        outputs = model.head(hidden, tokens, labels, scale, moe_out)
        outputs.objective.backward()
    else:
        ps.send_next(hidden)
        grad = ps.recv_next(hidden)
        aux_term = model.aux_objective(moe_out, scale)
        roots, grads = [hidden], [grad]
        if aux_term is not None:
            roots.append(aux_term)
            grads.append(torch.ones_like(aux_term))
        torch.autograd.backward(roots, grads)
    if hidden_in is not None:
        assert hidden_in.grad is not None
        ps.send_prev(hidden_in.grad)
    aux_raw = outputs.aux_raw if outputs is not None else [aux.detach() for aux, _ in moe_out]
    counts = outputs.counts if outputs is not None else [c for _, c in moe_out]
    return outputs, aux_raw, counts


def sum_gradients(model: Any, ps: Any) -> None:
    """Megatron's gradient all-reduces: over the data-parallel replicas, and the word embedding's gradient over
    its first- and last-stage copies (the last stage's serves MTP; `_allreduce_word_embedding_grads`)."""
    if ps.dp_size > 1:
        ps.all_reduce([p.grad for p in model.parameters() if p.grad is not None], ps.dp_group)
    if ps.pp_size > 1 and model.spec.mtp_num_layers and (model.first_stage or model.last_stage):
        ps.all_reduce([model.embedding.word_embeddings.weight.grad], ps.embedding_group)


# Parameters split over the tensor-parallel ranks (megatron's `tensor_model_parallel` attribute): the parallel
# linears and the embedding. Every other parameter (norms, router, shared-expert gate) is the same on each rank.
_TP_SPLIT = ("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight", "eh_proj.weight",
             "output_layer.weight", "word_embeddings.weight")


def gradient_norm(params: Mapping[str, Any], ps: Any) -> float:
    """The pre-clip gradient norm of the whole model: local squares of the parameters this rank owns (a
    replicated parameter on tensor-parallel rank 0 only, the last stage's embedding copy not at all), summed over
    the model-parallel ranks (megatron `get_grad_norm_fp32`). One rank: `global_norm` as it always was."""
    import torch

    from alignflow.twin.torch_optim import global_norm

    if ps.tp.size == 1 and ps.pp_size == 1:
        return float(global_norm(dict(params)))
    total = torch.zeros((), dtype=torch.float32)
    for name, p in params.items():
        assert p.grad is not None
        if ps.tp.rank != 0 and not name.endswith(_TP_SPLIT):
            continue
        if name.startswith("embedding.") and not ps.first_stage:
            continue
        total = total + (p.grad.float() * p.grad.float()).sum().cpu()
    ps.all_reduce([total], ps.mp_group)
    return float(torch.sqrt(total))


def _rank_layout(model_config: Any, ps: Any) -> Any:
    """This rank's torch_dist layout, planned by megatron-core on rank 0 and sent to every rank."""
    from alignflow.config.parallel import ParallelConfig
    from alignflow.convert.sharding import RankLayout, plan_layouts

    data: list[Any] = [None]
    if ps.first:
        layouts = plan_layouts(model_config, ParallelConfig(tp=ps.tp.size, pp=ps.pp_size))
        data = [[r.to_json() for r in layouts.ranks]]
    ps.broadcast(data)
    for raw in data[0]:
        rank = RankLayout.from_json(raw)
        if (rank.tp, rank.pp) == (ps.tp.rank, ps.pp_rank):
            return rank
    raise AssertionError("megatron-core planned no layout for this rank")


def _check_real_parser(argv: Sequence[str], version: str) -> None:
    """Refuse what megatron-core `version`'s own argument parser refuses (when alignflow has its table)."""
    from alignflow.errors import ConfigError
    from alignflow.frameworks.megatron_lm import check_flags

    accepted, why = check_flags(argv, version)
    if accepted is False:
        raise ConfigError(f"{WHERE}: real Megatron-LM would not start: {why}")


def _quiet(*args: object) -> None:
    """A rank's print that Megatron only makes on another rank."""


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
    for name in ("alignflow.twin.torch_checkpoint",):
        child = logging.getLogger(name)
        child.handlers[:] = [handler]
        child.setLevel(logging.INFO)
        child.propagate = False
    from alignflow.twin.megatron_flags import parse_megatron_args

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        twin = TwinSettings.from_env(os.environ)
        ns = parse_megatron_args(args)
        _check_real_parser(args, twin.megatron_version)
        train(ns, twin, faults=faults_from_env(os.environ), dump=request_from_env(os.environ))
    except AlignflowError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
