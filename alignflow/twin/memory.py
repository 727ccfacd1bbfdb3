"""What one rank of the twin holds in device memory, and the frameworks' own lines that report it.

A CPU has no device allocator to ask: MindSpore's `max_memory_allocated()` returns 0 on the CPU backend
(`mindspore/runtime/memory.py`) and torch's CPU allocator keeps no statistics. So the twin on a CPU *counts*
what a device allocator would hold for it, from the shapes of its own computation: parameters, their gradients
and the two AdamW moments (fp32, as both twins keep them), plus the activations autograd keeps for the backward
pass of one micro-batch — every tensor the twin's forward saves, layer by layer, the logits and the loss. This is
a model of the allocator, not a measurement (the code says so wherever it is printed); on a CUDA device the
PyTorch twin reports torch's real `torch.cuda` statistics instead.

The model answers the questions a switch matrix asks of memory (seed 004, section 4.2), with the right sign and
a plausible size:

- full recomputation (`recompute_num_layers` > 0) keeps only each recomputed chunk's input, plus one chunk's
  activations while that chunk is recomputed;
- the fused SwiGLU (megatron's `SwiGLUFunction`) saves its input only, not the SiLU output;
- a smaller micro-batch (the same global batch in more micro-batches) shrinks every activation;
- data parallelism leaves a rank's memory as it was (no distributed optimizer in the twin).

The lines are the frameworks' own: megatron's `report_memory` (`megatron/training/utils.py`, printed by
`alignflow.twin.logformats.megatron_memory_line` with the PyTorch twin's figures, `torch_train._Memory`) and
MindSpore's memory statistics at the end of a run (`Used peak memory usage (without fragments): NM`,
`Actual peak memory usage (with fragments): NM`, printed with `MS_MEMORY_STATISTIC=1`, MindSpore's dry-run and
tuning guides). An out-of-memory is raised with each framework's own message (`oom_message_*`), so that the
matrix recognises a twin's OOM exactly as it recognises a real one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from alignflow.twin.presets import TwinSpec

FP32 = 4
MIB = 1024 * 1024
# torch's caching allocator rounds large blocks to 2 MiB segments; the twin's "reserved" follows it
SEGMENT = 2 * MIB
# MindSpore's statistic block: Ascend 910B's HBM as MindSpore reports it, and its default max_device_memory
ASCEND_HBM_MB = 62432
MS_MEMORY_STATISTIC = "MS_MEMORY_STATISTIC"


@dataclass(frozen=True, slots=True)
class TwinMemory:
    """One rank's device memory in bytes: `static` (parameters, gradients, AdamW moments) is what stays
    allocated between steps; `peak` adds the largest set of activations alive at once during a step."""

    static: int
    activations: int

    @property
    def peak(self) -> int:
        return self.static + self.activations

    @property
    def reserved(self) -> int:
        return -(-self.peak // SEGMENT) * SEGMENT


def parameter_count(spec: TwinSpec) -> int:
    """Parameters of the twin (both sides build the same shapes)."""
    h, v = spec.hidden_size, spec.vocab_size
    attention = spec.qkv_rows * h + h * spec.num_heads * spec.head_dim + 2 * h
    if spec.qk_layernorm:
        attention += 2 * spec.head_dim

    def mlp(ffn: int) -> int:
        return 3 * ffn * h

    def layer(moe: bool) -> int:
        if not moe or spec.moe is None:
            return attention + mlp(spec.ffn_hidden_size)
        m = spec.moe
        shared = mlp(m.shared_ffn_hidden_size) + (h if m.shared_expert_gate else 0) if m.shared_ffn_hidden_size else 0
        return attention + m.num_experts * h + m.num_experts * mlp(m.ffn_hidden_size) + shared

    total = 2 * v * h + h  # embedding, output layer, final norm
    total += sum(layer(moe) for moe in spec.moe_layers)
    total += spec.mtp_num_layers * (layer(spec.mtp_inner_is_moe) + 2 * h * h + 3 * h)
    return total


def _layer_activations(spec: TwinSpec, tokens: int, *, moe: bool, fused_swiglu: bool) -> int:
    """Elements one decoder layer saves for its backward pass, for `tokens` = micro-batch x sequence."""
    h, a, d = spec.hidden_size, spec.num_heads, spec.head_dim
    s = spec.seq_length
    b = tokens // s
    # two RMSNorm inputs, the qkv input and output, rotated q and (repeated) k and v, the attention scores and
    # probabilities, the context and the projection input
    attention = 2 * tokens * h + tokens * h + tokens * spec.qkv_rows + 3 * tokens * a * d + 2 * b * a * s * s \
        + 2 * tokens * a * d

    def mlp(ffn: int, rows: int) -> int:
        # fc1 input, fc1 output (gate and up), the SiLU output unless fused, the fc2 input
        return rows * h + rows * 2 * ffn + (0 if fused_swiglu else rows * ffn) + rows * ffn

    if not moe or spec.moe is None:
        return attention + mlp(spec.ffn_hidden_size, tokens)
    m = spec.moe
    # router logits, probabilities and top-k; the twin's experts each see every token (dense dispatch)
    routed = 3 * tokens * m.num_experts + m.num_experts * (mlp(m.ffn_hidden_size, tokens) + tokens)
    shared = mlp(m.shared_ffn_hidden_size, tokens) + (tokens if m.shared_expert_gate else 0) \
        if m.shared_ffn_hidden_size else 0
    return attention + routed + shared


def twin_memory(spec: TwinSpec, *, micro_batch_size: int, recompute_num_layers: int = 0,
                fused_swiglu: bool = False) -> TwinMemory:
    """The allocator model of one rank of the twin (see the module docstring)."""
    tokens = micro_batch_size * spec.seq_length
    layers = [_layer_activations(spec, tokens, moe=m, fused_swiglu=fused_swiglu) for m in spec.moe_layers]
    if recompute_num_layers > 0:
        chunk = recompute_num_layers
        chunks = [layers[i:i + chunk] for i in range(0, len(layers), chunk)]
        decoder = len(chunks) * tokens * spec.hidden_size + max(sum(c) for c in chunks)
    else:
        decoder = sum(layers)
    head = tokens * spec.hidden_size + 2 * tokens * spec.vocab_size  # final norm input, logits, softmax
    mtp = spec.mtp_num_layers * (
        _layer_activations(spec, tokens, moe=spec.mtp_inner_is_moe, fused_swiglu=fused_swiglu)
        + 4 * tokens * spec.hidden_size + 2 * tokens * spec.vocab_size)
    params = parameter_count(spec)
    return TwinMemory(static=4 * FP32 * params, activations=FP32 * (decoder + head + mtp))


def mindspore_memory_statistic(memory: TwinMemory, *, max_device_memory_mb: int) -> list[str]:
    """MindSpore's end-of-run memory statistics (integer MB, `M`), as its guides show them."""
    return [
        f"Device HBM memory size: {ASCEND_HBM_MB}M",
        f"MindSpore Used memory size: {max_device_memory_mb}M",
        "MindSpore memory base address: 0",
        f"Used peak memory usage (without fragments): {math.ceil(memory.peak / MIB)}M",
        f"Actual peak memory usage (with fragments): {math.ceil(memory.reserved / MIB)}M",
    ]


def parse_memory_size(text: str) -> int:
    """MindSpore's `max_device_memory` string (`"59GB"`, `"512MB"`) in bytes; `ValueError` otherwise."""
    value = text.strip().upper()
    for unit, scale in (("GB", 1024 ** 3), ("MB", MIB), ("KB", 1024)):
        if value.endswith(unit):
            number = float(value[: -len(unit)])
            if not number > 0:
                break
            return int(number * scale)
    raise ValueError(f"{text!r}: expected a size such as 59GB or 512MB")


def mindspore_oom_message(request: int, *, max_device_memory: int, used: int) -> str:
    """MindSpore's out-of-memory error (`AscendMemAdapter`, mindspore/ccsrc/.../ascend_memory_adapter.cc)."""
    return ("----------------------------------------------------\n"
            "- Framework Error Message:\n"
            "----------------------------------------------------\n"
            f"Out of Memory!!! Request memory size: {request}B, Memory Statistic:\n"
            f"Device HBM memory size: {ASCEND_HBM_MB}M\n"
            f"MindSpore Used memory size: {max_device_memory // MIB}M\n"
            "MindSpore memory base address: 0\n"
            f"Total Static Memory size: {used // MIB}M\n"
            "Total Dynamic memory size: 0M\n\n"
            "Please try to reduce 'batch_size' or check whether exists extra large shape. For more details, please "
            "refer to 'Out of Memory' at https://www.mindspore.cn .")


def torch_oom_message(request: int, *, capacity: int, allocated: int, device: int = 0) -> str:
    """torch's CUDA caching-allocator message (c10/cuda/CUDACachingAllocator.cpp)."""
    free = max(capacity - allocated, 0)
    return (f"CUDA out of memory. Tried to allocate {request / MIB:.2f} MiB. GPU {device} has a total capacity of "
            f"{capacity / MIB:.2f} MiB of which {free / MIB:.2f} MiB is free. Of the allocated memory "
            f"{allocated / MIB:.2f} MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
            "unallocated.")
