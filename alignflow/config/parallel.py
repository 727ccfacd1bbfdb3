"""The parallel layout of a training: `training.parallel: {tp, pp, ep, dp}` (and per side `npu.parallel`,
`gpu.parallel`), and the rules both frameworks impose on it.

One training runs `tp * pp * dp` processes (Megatron's world size without context parallelism; MindFormers'
`model_parallel * pipeline_stage * data_parallel`). Expert parallelism is carved out of the data-parallel ranks
(Megatron's expert groups; MindFormers' `expert_parallel` divides `data_parallel`), so it adds no process.

The global batch stays the experiment's on every layout: each optimizer step consumes the same
`global_batch_size` samples in the same order whatever the layout (Megatron's pretraining sampler hands data
rank r the r-th micro-batch of each `micro_batch_size * dp` slice; MindFormers shards the same sequence by data
rank), so two sides on different layouts still see the same samples per step - provided the global batch is a
multiple of `micro_batch_size * dp` on each side (Megatron asserts it: "global batch size is not divisible by
micro batch size times data parallel size", megatron/training/arguments.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ParallelConfig(BaseModel):
    """Tensor, pipeline, expert and data parallel sizes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int = Field(1, ge=1, description="Tensor parallel size (`--tensor-model-parallel-size`, `model_parallel`).")
    pp: int = Field(1, ge=1, description="Pipeline stages (`--pipeline-model-parallel-size`, `pipeline_stage`).")
    ep: int = Field(1, ge=1, description="Expert parallel size (`--expert-model-parallel-size`, `expert_parallel`); "
                    "divides dp.")
    dp: int = Field(1, ge=1, description="Data parallel size (Megatron derives it from the world size; "
                    "MindFormers' `data_parallel`).")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def problems(self, *, micro_batch_size: int, global_batch_size: int, num_experts: int | None,
                 num_layers: int, num_attention_heads: int, where: str) -> list[str]:
        """What Megatron's or MindFormers' argument checks would refuse about this layout."""
        out = []
        if global_batch_size % (micro_batch_size * self.dp):
            out.append(f"{where}: training.global_batch_size {global_batch_size} is not a multiple of "
                       f"micro_batch_size {micro_batch_size} x dp {self.dp}")
        if self.dp % self.ep:
            out.append(f"{where}: ep {self.ep} must divide dp {self.dp} (expert parallel ranks are data ranks)")
        if self.ep > 1 and (num_experts is None or num_experts % self.ep):
            out.append(f"{where}: ep {self.ep} needs a number of experts divisible by it (model has "
                       f"{num_experts or 'none'})")
        if num_layers % self.pp:
            out.append(f"{where}: pp {self.pp} must divide num_layers {num_layers}")
        if num_attention_heads % self.tp:
            out.append(f"{where}: tp {self.tp} must divide num_attention_heads {num_attention_heads}")
        return out
