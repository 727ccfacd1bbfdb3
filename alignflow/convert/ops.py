"""Tensor ops of the conversion rules: each op transforms a list of tensors and knows its inverse and its shapes.

A rule's op chain turns the MindFormers tensors of one rule into the Megatron tensors (`forward`); the reverse
conversion runs the inverse of every op in reverse order, so one table yields both directions and a round trip
is bit-exact by construction (every op below only moves elements, except `cast`). Shapes are propagated
without touching data, which is how a plan checks every shape of a checkpoint before reading a single tensor.

Arity: 1->1 ops (transpose, interleave, squeeze, reshape, cast, rename) apply to each tensor of the list;
many->1 ops (concat, concat_grouped, stack) consume the whole list; 1->many ops (split, split_grouped, unstack) need
exactly one input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Shape = tuple[int, ...]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class ShapeError(ValueError):
    """An op cannot take the shapes it is given (a spec that does not fit the model or the checkpoint)."""


def _norm_dim(dim: int, rank: int) -> int:
    d = dim + rank if dim < 0 else dim
    if not 0 <= d < rank:
        raise ShapeError(f"dim {dim} out of range for a {rank}-d tensor")
    return d


def _single(shapes: Sequence[Shape], name: str) -> Shape:
    if len(shapes) != 1:
        raise ShapeError(f"{name} takes one tensor, got {len(shapes)}")
    return shapes[0]


@dataclass(frozen=True, slots=True)
class Rename:
    """Identity: the rule's patterns do the renaming. Listed so that a spec can say so explicitly."""

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return xs

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        return shapes

    def inverse(self) -> Op:
        return self


@dataclass(frozen=True, slots=True)
class Transpose:
    """Swap two dims: MindFormers stores linear weights `[in, out]` where Megatron stores `[out, in]`."""

    dims: tuple[int, int] = (-2, -1)

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [x.transpose(*self.dims) for x in xs]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        out = []
        for s in shapes:
            a, b = (_norm_dim(d, len(s)) for d in self.dims)
            lst = list(s)
            lst[a], lst[b] = lst[b], lst[a]
            out.append(tuple(lst))
        return out

    def inverse(self) -> Op:
        return self


@dataclass(frozen=True, slots=True)
class DeinterleaveRows:
    """`[g0, u0, g1, u1, ...]` -> `[g0, g1, ...; u0, u1, ...]` along `dim`: MindFormers PyNative SwiGLU `linear_fc1`
    is row-interleaved, Megatron's is `[gate; up]` (docs/seeds.md#ffn-mapping-rules,
    docs/seeds.md#glm-52-conversion-rules)."""

    dim: int = 0

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for x in xs:
            d = _norm_dim(self.dim, x.dim())
            s = tuple(x.shape)
            pairs = x.reshape(*s[:d], s[d] // 2, 2, *s[d + 1 :])  # [..., n, 2, ...]
            out.append(pairs.movedim(d + 1, d).reshape(s))  # [..., 2, n, ...] -> [gate; up]
        return out

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        for s in shapes:
            if s[_norm_dim(self.dim, len(s))] % 2:
                raise ShapeError(f"cannot (de)interleave an odd dim: {list(s)}")
        return shapes

    def inverse(self) -> Op:
        return InterleaveRows(self.dim)


@dataclass(frozen=True, slots=True)
class InterleaveRows:
    """`[gate; up]` -> `[g0, u0, g1, u1, ...]` along `dim` (the inverse of `deinterleave_rows`)."""

    dim: int = 0

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for x in xs:
            d = _norm_dim(self.dim, x.dim())
            s = tuple(x.shape)
            halves = x.reshape(*s[:d], 2, s[d] // 2, *s[d + 1 :])  # [..., 2, n, ...]
            out.append(halves.movedim(d, d + 1).reshape(s))
        return out

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        return DeinterleaveRows(self.dim).shapes(shapes)

    def inverse(self) -> Op:
        return DeinterleaveRows(self.dim)


@dataclass(frozen=True, slots=True)
class Concat:
    """Join the inputs along `dim`; `sections` (the inputs' sizes along `dim`) make the inverse `split` exact."""

    dim: int
    sections: tuple[int, ...]

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat(xs, dim=self.dim)]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        if len(shapes) != len(self.sections):
            raise ShapeError(f"concat of {len(self.sections)} sections got {len(shapes)} tensors")
        first = shapes[0]
        d = _norm_dim(self.dim, len(first))
        for s, size in zip(shapes, self.sections, strict=True):
            if len(s) != len(first) or s[d] != size or s[:d] + s[d + 1 :] != first[:d] + first[d + 1 :]:
                raise ShapeError(f"concat along dim {self.dim} with sections {list(self.sections)} cannot take "
                                 f"shapes {[list(x) for x in shapes]}")
        return [(*first[:d], sum(self.sections), *first[d + 1 :])]

    def inverse(self) -> Op:
        return Split(self.dim, self.sections)


@dataclass(frozen=True, slots=True)
class Split:
    """Cut one tensor along `dim` into `sections` (e.g. MLA's fused `linear_qkv` into q/kv down-projections)."""

    dim: int
    sections: tuple[int, ...]

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(torch.split(xs[0], list(self.sections), dim=self.dim))

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        s = _single(shapes, "split")
        d = _norm_dim(self.dim, len(s))
        if s[d] != sum(self.sections):
            raise ShapeError(f"split of dim {self.dim} into {list(self.sections)} needs size {sum(self.sections)}, "
                             f"got {list(s)}")
        return [(*s[:d], size, *s[d + 1 :]) for size in self.sections]

    def inverse(self) -> Op:
        return Concat(self.dim, self.sections)


@dataclass(frozen=True, slots=True)
class ConcatGrouped:
    """Join the inputs group by group along `dim`: each input is `G` equal chunks of its `sections` entry, and the
    output is `[a_0; b_0; c_0; a_1; b_1; c_1; ...]` — Megatron's `linear_qkv`, which holds for each query group its
    query heads, then its key, then its value (`sections`: per-group sizes; `G` follows from the inputs' sizes).
    Hugging Face keeps `q_proj`, `k_proj`, `v_proj` apart."""

    dim: int
    sections: tuple[int, ...]

    def _groups(self, shapes: list[Shape]) -> int:
        if len(shapes) != len(self.sections) or not shapes:
            raise ShapeError(f"concat_grouped of {len(self.sections)} inputs got {len(shapes)} tensors")
        d = _norm_dim(self.dim, len(shapes[0]))
        groups = {s[d] // size if size and s[d] % size == 0 else -1 for s, size in zip(shapes, self.sections,
                                                                                       strict=True)}
        rest = {s[:d] + s[d + 1:] for s in shapes}
        if len(groups) != 1 or -1 in groups or 0 in groups or len(rest) != 1 or len({len(s) for s in shapes}) != 1:
            raise ShapeError(f"concat_grouped along dim {self.dim} with per-group sections {list(self.sections)} "
                             f"cannot take shapes {[list(x) for x in shapes]}")
        return groups.pop()

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        groups = self._groups([tuple(x.shape) for x in xs])
        chunks = [torch.split(x, size, dim=self.dim) for x, size in zip(xs, self.sections, strict=True)]
        return [torch.cat([c[g] for g in range(groups) for c in chunks], dim=self.dim)]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        groups = self._groups(shapes)
        first = shapes[0]
        d = _norm_dim(self.dim, len(first))
        return [(*first[:d], groups * sum(self.sections), *first[d + 1:])]

    def inverse(self) -> Op:
        return SplitGrouped(self.dim, self.sections)


@dataclass(frozen=True, slots=True)
class SplitGrouped:
    """The inverse of `concat_grouped`: `[a_0; b_0; c_0; a_1; ...]` -> `[a_0; a_1; ...]`, `[b_0; b_1; ...]`, ..."""

    dim: int
    sections: tuple[int, ...]

    def _groups(self, shape: Shape) -> int:
        d = _norm_dim(self.dim, len(shape))
        per = sum(self.sections)
        if not per or shape[d] % per:
            raise ShapeError(f"split_grouped of dim {self.dim} into groups of {list(self.sections)} cannot take "
                             f"{list(shape)}")
        return shape[d] // per

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        groups = self._groups(tuple(xs[0].shape))
        parts = torch.split(xs[0], list(self.sections) * groups, dim=self.dim)
        n = len(self.sections)
        return [torch.cat(parts[i::n], dim=self.dim) for i in range(n)]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        s = _single(shapes, "split_grouped")
        groups = self._groups(s)
        d = _norm_dim(self.dim, len(s))
        return [(*s[:d], groups * size, *s[d + 1:]) for size in self.sections]

    def inverse(self) -> Op:
        return ConcatGrouped(self.dim, self.sections)


@dataclass(frozen=True, slots=True)
class Stack:
    """Stack per-expert tensors into one `[E, ...]` tensor."""

    dim: int = 0

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.stack(xs, dim=self.dim)]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        if any(s != shapes[0] for s in shapes):
            raise ShapeError(f"stack needs equal shapes, got {[list(s) for s in shapes]}")
        s = shapes[0]
        d = _norm_dim(self.dim, len(s) + 1)
        return [(*s[:d], len(shapes), *s[d:])]

    def inverse(self) -> Op:
        return Unstack(self.dim)


@dataclass(frozen=True, slots=True)
class Unstack:
    """`[E, ...]` -> E tensors (grouped MindFormers experts -> Megatron's per-expert linears)."""

    dim: int = 0

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(torch.unbind(xs[0], dim=self.dim))

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        s = _single(shapes, "unstack")
        d = _norm_dim(self.dim, len(s))
        return [s[:d] + s[d + 1 :]] * s[d]

    def inverse(self) -> Op:
        return Stack(self.dim)


@dataclass(frozen=True, slots=True)
class Squeeze:
    """Drop a size-1 dim (GDN `conv1d` `[C, 1, 1, K]` -> `[C, 1, K]`, docs/seeds.md#common-mapping-rules)."""

    dim: int

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [x.squeeze(self.dim) for x in xs]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        out = []
        for s in shapes:
            d = _norm_dim(self.dim, len(s))
            if s[d] != 1:
                raise ShapeError(f"cannot squeeze dim {self.dim} of {list(s)}")
            out.append(s[:d] + s[d + 1 :])
        return out

    def inverse(self) -> Op:
        return Unsqueeze(self.dim)


@dataclass(frozen=True, slots=True)
class Unsqueeze:
    """Insert a size-1 dim (the inverse of `squeeze`)."""

    dim: int

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [x.unsqueeze(self.dim) for x in xs]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        return [(*s[: _norm_dim(self.dim, len(s) + 1)], 1, *s[_norm_dim(self.dim, len(s) + 1) :]) for s in shapes]

    def inverse(self) -> Op:
        return Squeeze(self.dim)


@dataclass(frozen=True, slots=True)
class Reshape:
    """View `source` as `target` (graph-mode MindFormers experts `[E*H, 2F]` <-> `[E, H, 2F]`)."""

    source: Shape
    target: Shape

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [x.reshape(self.target) for x in xs]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        for s in shapes:
            if s != self.source:
                raise ShapeError(f"reshape expects {list(self.source)}, got {list(s)}")
        return [self.target] * len(shapes)

    def inverse(self) -> Op:
        return Reshape(self.target, self.source)


@dataclass(frozen=True, slots=True)
class Cast:
    """Change the dtype; the inverse casts back, which is exact only where `target` represents every value."""

    source: str
    target: str

    def apply(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        want = DTYPES[self.target]
        return [x.to(want) for x in xs]

    def shapes(self, shapes: list[Shape]) -> list[Shape]:
        return shapes

    def inverse(self) -> Op:
        return Cast(self.target, self.source)


Op = Rename | Transpose | DeinterleaveRows | InterleaveRows | Concat | Split | ConcatGrouped | SplitGrouped | Stack \
    | Unstack | Squeeze | Unsqueeze | Reshape | Cast

# name -> (parameter names with defaults (None = required), factory from evaluated parameters)
_Factory = Callable[[Mapping[str, Any]], Op]
OPS: dict[str, tuple[dict[str, Any], _Factory]] = {
    "rename": ({}, lambda p: Rename()),
    "transpose": ({"dims": [-2, -1]}, lambda p: Transpose((int(p["dims"][0]), int(p["dims"][1])))),
    "deinterleave_rows": ({"dim": 0}, lambda p: DeinterleaveRows(int(p["dim"]))),
    "interleave_rows": ({"dim": 0}, lambda p: InterleaveRows(int(p["dim"]))),
    "concat": ({"dim": 0, "sections": None}, lambda p: Concat(int(p["dim"]), tuple(p["sections"]))),
    "split": ({"dim": 0, "sections": None}, lambda p: Split(int(p["dim"]), tuple(p["sections"]))),
    "concat_grouped": ({"dim": 0, "sections": None},
                       lambda p: ConcatGrouped(int(p["dim"]), tuple(p["sections"]))),
    "split_grouped": ({"dim": 0, "sections": None}, lambda p: SplitGrouped(int(p["dim"]), tuple(p["sections"]))),
    "stack": ({"dim": 0}, lambda p: Stack(int(p["dim"]))),
    "unstack": ({"dim": 0}, lambda p: Unstack(int(p["dim"]))),
    "squeeze": ({"dim": None}, lambda p: Squeeze(int(p["dim"]))),
    "unsqueeze": ({"dim": None}, lambda p: Unsqueeze(int(p["dim"]))),
    "reshape": ({"source": None, "target": None}, lambda p: Reshape(tuple(p["source"]), tuple(p["target"]))),
    "cast": ({"source": None, "target": None}, lambda p: Cast(str(p["source"]), str(p["target"]))),
}

# Parameters that hold shape expressions (evaluated against the model's dimensions), per op.
EXPRESSION_PARAMS: dict[str, tuple[str, ...]] = {
    "concat": ("sections",),
    "split": ("sections",),
    "concat_grouped": ("sections",),
    "split_grouped": ("sections",),
    "reshape": ("source", "target"),
}


def apply_chain(ops: Sequence[Op], xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run `ops` in order over `xs`."""
    for op in ops:
        xs = op.apply(xs)
    return xs


def chain_shapes(ops: Sequence[Op], shapes: list[Shape]) -> list[Shape]:
    """Propagate shapes through `ops` (raises `ShapeError` where an op cannot take them)."""
    for op in ops:
        shapes = op.shapes(shapes)
    return shapes


def inverse_chain(ops: Sequence[Op]) -> tuple[Op, ...]:
    """The chain that undoes `ops`."""
    return tuple(op.inverse() for op in reversed(ops))
