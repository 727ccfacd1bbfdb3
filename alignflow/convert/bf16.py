"""Step 2 of the pipeline: a MindFormers checkpoint -> the bf16 MindFormers checkpoint both trainings start from.

Why a separate step: Megatron trains from bf16 weights, so the NPU reload must start from the *same* bf16
values (docs/mindformers.md#the-official-mindformers-to-megatron-loader: "convert MindSpore Transformers weights to bf16
before loading"). The cast
is torch's own `.to(torch.bfloat16)` (round-to-nearest-even, NaN -> canonical NaN), so the bits are exactly
those the GPU side would produce from the same fp32 values. What is left out is a table, not code paths.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from alignflow.convert.layout import COMMON_JSON, TRACKER, iteration_dir_name, model_file_name
from alignflow.convert.mindformers import DEFAULT_PREFIX, common_json, open_mindformers
from alignflow.convert.summary import ConversionSummary, ProgressFn, dtype_counts, staged_output
from alignflow.convert.tensor_io import StreamingSafetensorsWriter, TensorMeta
from alignflow.errors import ConversionError

log = logging.getLogger(__name__)

# Never part of a model checkpoint (docs/mindformers.md#checkpoint-layout,
# docs/mindformers.md#npu-side-checklist-per-pipeline-step step 2): optimizer state by prefix ...
OPTIMIZER_PREFIXES = ("main_param.", "adam_m.", "adam_v.", "max_exp_avg_sq.")
OPTIMIZER_NAMES = ("global_step",)
# ... and per-step counters by the last name component (MoE token counts, global aux-loss accumulators).
COUNTER_NAMES = ("tokens_per_expert", "global_tokens_per_expert", "ga_steps")
# Kept in fp32: the aux-loss-free expert bias is updated in fp32 on both sides
# (Megatron `_maintain_float32_expert_bias`).
FP32_NAMES = ("expert_bias",)


def drop_reason(name: str) -> str | None:
    """Why `name` is left out of a model checkpoint, or None if it is a model tensor."""
    if name.startswith(OPTIMIZER_PREFIXES) or name in OPTIMIZER_NAMES:
        return "optimizer state"
    if name.rsplit(".", 1)[-1] in COUNTER_NAMES:
        return "counter"
    return None


def bf16_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype `name` gets in the bf16 checkpoint: bf16 for floating tensors, fp32 for the expert bias,
    integer tensors unchanged (a routing table is not a weight)."""
    if not dtype.is_floating_point:
        return dtype
    return torch.float32 if name.rsplit(".", 1)[-1] in FP32_NAMES else torch.bfloat16


def convert_bf16(src: Path, dst: Path, *, progress: ProgressFn | None = None,
                 prefix: str | None = None, strategy: Path | None = None) -> ConversionSummary:
    """Convert the MindFormers checkpoint `src` into a bf16 MindFormers checkpoint directory `dst`.

    `src`: a checkpoint directory with `latest_checkpointed_iteration.txt`, an `iteration_*` directory (multi-rank
    shards are merged through `metadata.json`), one `.safetensors` file, a legacy `.ckpt` (needs MindSpore), per-rank
    `rank_*/` files merged by their parallel strategy (`strategy`, else the one beside them; needs MindSpore), or
    MindSpore's unified safetensors.
    `dst` gets `latest_checkpointed_iteration.txt`, `iteration_%08d/<prefix>-model-0000000-0000001.safetensors`
    and the 7-key `common.json`, and no `metadata.json` (MindFormers then treats every tensor as whole,
    docs/mindformers.md#loading-a-checkpoint-for-training). `prefix` defaults to the source's file prefix, else
    `checkpoint`. Nothing is written unless all succeeds.
    """
    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    with open_mindformers(src, strategy=strategy) as ckpt:
        dropped = sorted(ckpt.optimizer_keys)
        layout: list[tuple[str, TensorMeta]] = []
        for name, meta in ckpt.tensors.items():
            if drop_reason(name) is not None:
                dropped.append(name)
            else:
                layout.append((name, TensorMeta(meta.shape, bf16_dtype(name, meta.dtype))))
        if not layout:
            raise ConversionError([f"{src}: no model tensors (found {len(dropped)} optimizer/counter tensors only)"],
                                  header="bf16 conversion failed")
        iteration = ckpt.iteration if ckpt.iteration is not None else 0
        file_name = model_file_name(prefix or ckpt.prefix or DEFAULT_PREFIX)
        total = sum(ckpt.tensors[name].nbytes for name, _ in layout)
        done = 0
        with staged_output(dst, purpose="convert bf16") as tmp:
            out_dir = tmp / iteration_dir_name(iteration)
            out_dir.mkdir()
            metadata = {"format": "pt", "producer": "alignflow convert bf16"}
            with StreamingSafetensorsWriter(out_dir / file_name, layout, metadata, cast=True) as writer:
                for name, _ in layout:
                    writer.write(name, ckpt.read(name))  # cast by the writer, chunk by chunk
                    done += ckpt.tensors[name].nbytes
                    if progress is not None:
                        progress(done, total)
            common, notes = common_json(ckpt.common, iteration)
            (out_dir / COMMON_JSON).write_text(json.dumps(common, indent=4), encoding="utf-8")
            (tmp / TRACKER).write_text(str(iteration), encoding="utf-8")
            written = writer.bytes_written
    if ckpt.common is None:
        notes.append(f"common.json: the source has none; wrote defaults for iteration {iteration}")
    log.info("bf16: %d tensors (%d bytes) -> %s, %d dropped", len(layout), written, dst, len(dropped))
    return ConversionSummary(
        kind="bf16", source=str(src), destination=str(dst), iteration=iteration, tensors=len(layout), bytes=written,
        seconds=round(time.perf_counter() - start, 3),
        output_files=(TRACKER, f"{iteration_dir_name(iteration)}/{COMMON_JSON}",
                      f"{iteration_dir_name(iteration)}/{file_name}"),
        dropped=tuple(dropped), dtypes=dtype_counts([str(m.dtype).removeprefix("torch.") for _, m in layout]),
        notes=tuple(notes),
    )
