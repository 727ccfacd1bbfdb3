"""Data parallelism of the PyTorch twin under torchrun, done the way Megatron does it.

`torchrun --nproc_per_node N -m alignflow.twin.torch_train ...` starts N ranks (RANK, WORLD_SIZE, MASTER_ADDR
from torchrun's environment); each holds the whole model (the twin has no tensor or pipeline parallelism). Per
optimizer step, with `micro = global_batch / (micro_batch * dp)` micro-batches per rank:

- the data: Megatron's `MegatronPretrainingSampler` slices each `micro_batch * dp` run of the step's samples and
  gives rank r the r-th micro-batch of it (megatron/legacy/data/data_samplers.py), so the dp ranks together
  consume exactly the step's `global_batch` samples, in the order a single process would;
- the loss of each micro-batch is scaled by `1 / (micro * dp)` and the gradients are summed over the ranks
  (Megatron averages them over dp after scaling by 1 / micro: the same), so every rank steps with the
  gradient of the whole global batch;
- what is logged (losses, the MoE router's token counts for the expert bias) is summed over the ranks too;
- Megatron prints the iteration lines on the last rank only (`print_rank_last`) and its set-up lines on rank 0
  (`print_rank_0`); the twin does the same, so a rank-prefixed log reads like Megatron's.

gloo on CPU, nccl on CUDA. One process (no WORLD_SIZE): no process group, every call is the identity.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class DataParallel:
    """This process's rank among the twin's data-parallel ranks."""

    rank: int = 0
    size: int = 1
    _dist: Any = None

    @classmethod
    def from_env(cls, *, cuda: bool) -> DataParallel:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size <= 1:
            return cls()
        import torch
        import torch.distributed as dist

        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), dist)

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.size - 1

    def micro_batches(self, global_batch: int, micro_batch: int) -> int:
        """Micro-batches per rank and step; `ValueError` as Megatron's argument check when they do not divide."""
        if global_batch % (micro_batch * self.size):
            raise ValueError(f"global batch size ({global_batch}) is not divisible by micro batch size "
                             f"({micro_batch}) times data parallel size ({self.size})")
        return global_batch // (micro_batch * self.size)

    def rows(self, batch: Any, i: int, micro_batch: int) -> Any:
        """This rank's i-th micro-batch of the step's samples (`MegatronPretrainingSampler`'s slicing)."""
        start = (i * self.size + self.rank) * micro_batch
        return batch[start : start + micro_batch]

    def sum_grads(self, params: Iterable[Any]) -> None:
        if self._dist is None:
            return
        for p in params:
            if p.grad is not None:
                self._dist.all_reduce(p.grad)

    def sum_tensors(self, tensors: Sequence[Any]) -> None:
        if self._dist is not None:
            for t in tensors:
                self._dist.all_reduce(t)

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        if self._dist is None:
            return list(values)
        import torch

        t = torch.tensor(list(values), dtype=torch.float64)
        self._dist.all_reduce(t)
        return [float(x) for x in t]

    def close(self) -> None:
        if self._dist is not None:
            self._dist.destroy_process_group()
