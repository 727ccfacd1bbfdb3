"""Tensor and pipeline parallelism of the PyTorch twin, Megatron's way, on gloo (CPU) or nccl (CUDA).

Ranks are laid out as Megatron-LM lays them out (`RankGenerator`, order `tp-cp-ep-dp-pp`): the tensor-parallel rank
varies fastest, then the data-parallel rank, then the pipeline stage; the last rank is on the last stage, where the
loss is (`print_rank_last`). The tensor-parallel arithmetic is megatron-core's `tensor_parallel.mappings`:

- `copy_to` (identity forward, all-reduce of the gradient) in front of a column-parallel linear, `reduce_from`
  (all-reduce forward) after a row-parallel one, `gather_from` (all-gather of the last dimension, its gradient
  split) after the output layer and MTP's `eh_proj` (megatron-core gathers both);
- the embedding is vocabulary-parallel (each rank looks up its rows, zero elsewhere, then `reduce_from`);
- experts split their FFN like the dense MLP and reduce each expert's output before the router's weights multiply
  it (megatron-core reduces once after combining the experts: the same sum in another order).

Each pipeline stage holds its decoder layers (module-local numbering, as Megatron names them); the first holds the
embedding, the last the final norm, the output layer, MTP and - with MTP and more than one stage - a copy of the
embedding whose gradient is summed with the first stage's (`_allreduce_word_embedding_grads`). A micro-batch runs
forward stage by stage (send / recv of the hidden states), then backward the other way; its gradients add up in
the same order as without pipelining.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor


@dataclass
class TensorParallel:
    """This rank's place in its tensor-parallel group (size 1: every mapping is the identity)."""

    size: int = 1
    rank: int = 0
    group: Any = None

    def copy_to(self, x: Tensor) -> Tensor:
        return x if self.size == 1 else cast(Tensor, _CopyToTP.apply(x, self.group))  # type: ignore[no-untyped-call]

    def reduce_from(self, x: Tensor) -> Tensor:
        return x if self.size == 1 else cast(Tensor, _ReduceFromTP.apply(x, self.group))  # type: ignore[no-untyped-call]

    def gather_from(self, x: Tensor) -> Tensor:
        if self.size == 1:
            return x
        return cast(Tensor, _GatherFromTP.apply(x, self.group, self.size, self.rank))  # type: ignore[no-untyped-call]

    def split(self, n: int) -> tuple[int, int]:
        """This rank's [start, end) of `n` rows split evenly (megatron-core's `divide`: n % size == 0)."""
        assert n % self.size == 0, f"{n} does not split over {self.size} tensor-parallel ranks"
        part = n // self.size
        return self.rank * part, (self.rank + 1) * part


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        out = x.contiguous().clone()
        torch.distributed.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any, size: int, rank: int) -> Tensor:
        ctx.size, ctx.rank = size, rank
        parts = [torch.empty_like(x) for _ in range(size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return torch.chunk(grad, ctx.size, dim=-1)[ctx.rank].contiguous(), None, None, None


@dataclass
class ParallelState:
    """tp x dp x pp ranks of one training (`torchrun` sets RANK and WORLD_SIZE; one process: no group at all)."""

    tp: TensorParallel = field(default_factory=TensorParallel)
    dp_size: int = 1
    dp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    rank: int = 0
    world: int = 1
    dp_group: Any = None
    pp_group: Any = None
    mp_group: Any = None  # tensor x pipeline ranks of this data-parallel replica (the gradient norm's group)
    embedding_group: Any = None  # first and last stage of this tp rank / dp replica (with MTP and pp > 1)
    prev_rank: int | None = None
    next_rank: int | None = None
    _dist: Any = None

    @classmethod
    def from_env(cls, *, tp: int = 1, pp: int = 1, cuda: bool) -> ParallelState:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world % (tp * pp):
            raise ValueError(f"world size {world} is not a multiple of tensor ({tp}) x pipeline ({pp}) parallel size")
        if world <= 1:
            return cls()
        import torch.distributed as dist

        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        rank, dp = dist.get_rank(), world // (tp * pp)

        def coords(r: int) -> tuple[int, int, int]:  # (tp, dp, pp), tp fastest
            return r % tp, (r // tp) % dp, r // (tp * dp)

        def rank_of(t: int, d: int, p: int) -> int:
            return t + d * tp + p * tp * dp

        t_r, d_r, p_r = coords(rank)
        groups: dict[str, Any] = {}
        # every rank creates every group, in the same order (torch.distributed.new_group's contract)
        for d in range(dp):
            for p in range(pp):
                g = dist.new_group([rank_of(t, d, p) for t in range(tp)])
                if (d, p) == (d_r, p_r):
                    groups["tp"] = g
        for t in range(tp):
            for p in range(pp):
                g = dist.new_group([rank_of(t, d, p) for d in range(dp)])
                if (t, p) == (t_r, p_r):
                    groups["dp"] = g
        for t in range(tp):
            for d in range(dp):
                g = dist.new_group([rank_of(t, d, p) for p in range(pp)])
                if (t, d) == (t_r, d_r):
                    groups["pp"] = g
                g = dist.new_group(sorted({rank_of(t, d, 0), rank_of(t, d, pp - 1)}))
                if (t, d) == (t_r, d_r):
                    groups["embedding"] = g
        for d in range(dp):
            g = dist.new_group([rank_of(t, d, p) for p in range(pp) for t in range(tp)])
            if d == d_r:
                groups["mp"] = g
        return cls(TensorParallel(tp, t_r, groups["tp"]), dp, d_r, pp, p_r, rank, world, groups["dp"], groups["pp"],
                   groups["mp"], groups["embedding"],
                   rank_of(t_r, d_r, p_r - 1) if p_r > 0 else None,
                   rank_of(t_r, d_r, p_r + 1) if p_r < pp - 1 else None, dist)

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.world - 1

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def micro_batches(self, global_batch: int, micro_batch: int) -> int:
        """Micro-batches per rank and step; `ValueError` as Megatron's argument check when they do not divide."""
        if global_batch % (micro_batch * self.dp_size):
            raise ValueError(f"global batch size ({global_batch}) is not divisible by micro batch size "
                             f"({micro_batch}) times data parallel size ({self.dp_size})")
        return global_batch // (micro_batch * self.dp_size)

    def rows(self, batch: Any, i: int, micro_batch: int) -> Any:
        """This data-parallel rank's i-th micro-batch of the step's samples (`MegatronPretrainingSampler`)."""
        start = (i * self.dp_size + self.dp_rank) * micro_batch
        return batch[start : start + micro_batch]

    # --- collectives -------------------------------------------------------------------------------------------

    def all_reduce(self, tensors: list[Tensor], group: Any) -> None:
        if self._dist is not None:
            for t in tensors:
                self._dist.all_reduce(t, group=group)

    def sum_floats(self, values: list[float], group: Any) -> list[float]:
        if self._dist is None:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        self._dist.all_reduce(t, group=group)
        return [float(x) for x in t]

    def broadcast(self, objects: list[Any]) -> None:
        """Rank 0's `objects` on every rank (in place)."""
        if self._dist is not None:
            self._dist.broadcast_object_list(objects, src=0)

    def barrier(self) -> None:
        if self._dist is not None:
            self._dist.barrier()

    def send_next(self, x: Tensor) -> None:
        assert self.next_rank is not None
        self._dist.send(x.detach().contiguous(), self.next_rank)

    def recv_prev(self, like: Tensor) -> Tensor:
        assert self.prev_rank is not None
        out = torch.empty_like(like)
        self._dist.recv(out, self.prev_rank)
        return out

    def send_prev(self, grad: Tensor) -> None:
        assert self.prev_rank is not None
        self._dist.send(grad.contiguous(), self.prev_rank)

    def recv_next(self, like: Tensor) -> Tensor:
        assert self.next_rank is not None
        out = torch.empty_like(like)
        self._dist.recv(out, self.next_rank)
        return out

    def close(self) -> None:
        if self._dist is not None:
            self._dist.destroy_process_group()
