"""Every op undoes its inverse bit for bit, its shape function agrees with what it does, and the GLU
de-interleave is exactly the seeds' `cat(w[0::2], w[1::2])`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alignflow.convert.ops import (
    Cast,
    Concat,
    DeinterleaveRows,
    InterleaveRows,
    Rename,
    Reshape,
    ShapeError,
    Split,
    Squeeze,
    Stack,
    Transpose,
    Unsqueeze,
    Unstack,
    apply_chain,
    chain_shapes,
    inverse_chain,
)

from .synthetic import same_bits

G = torch.Generator().manual_seed(1)


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=G).to(torch.bfloat16)


CASES = [
    (Rename(), [_t(3, 4)]),
    (Transpose(), [_t(4, 6, 8)]),
    (Transpose((0, 2)), [_t(4, 6, 8)]),
    (DeinterleaveRows(), [_t(10, 3)]),
    (DeinterleaveRows(1), [_t(3, 10, 2)]),
    (InterleaveRows(), [_t(10, 3)]),
    (Concat(0, (6, 2, 1, 1)), [_t(6, 4), _t(2, 4), _t(1, 4), _t(1, 4)]),
    (Concat(1, (3, 5)), [_t(2, 3), _t(2, 5)]),
    (Split(0, (4, 6)), [_t(10, 3)]),
    (Stack(), [_t(5, 3), _t(5, 3), _t(5, 3)]),
    (Unstack(), [_t(4, 5, 3)]),
    (Squeeze(2), [_t(6, 1, 1, 4)]),
    (Unsqueeze(1), [_t(6, 4)]),
    (Reshape((8, 3), (2, 4, 3)), [_t(8, 3)]),
    (Cast("float32", "bfloat16"), [torch.randn(3, 4, generator=G)]),
]


@pytest.mark.parametrize(("op", "xs"), CASES, ids=[type(c[0]).__name__ + str(i) for i, c in enumerate(CASES)])
def test_op_inverse_restores_every_bit_and_shapes_match(op, xs):
    ys = op.apply(list(xs))
    assert [tuple(y.shape) for y in ys] == op.shapes([tuple(x.shape) for x in xs])
    back = op.inverse().apply(ys)
    if isinstance(op, Cast):  # exact only where the target dtype holds the values: cast bf16-representable ones
        xs = [x.to(torch.bfloat16).to(torch.float32) for x in xs]
        back = op.inverse().apply(op.apply(xs))
    assert len(back) == len(xs)
    assert all(same_bits(a, b.contiguous()) for a, b in zip(xs, back, strict=True))


def test_deinterleave_is_the_seed_formula():
    w = torch.arange(24 * 5, dtype=torch.float32).reshape(24, 5)
    (got,) = DeinterleaveRows().apply([w])
    assert torch.equal(got, torch.cat([w[0::2], w[1::2]]))  # docs/seeds.md#ffn-mapping-rules
    order = np.concatenate([np.arange(0, 24, 2), np.arange(1, 24, 2)])  # docs/seeds.md#glm-52-conversion-rules
    assert torch.equal(got, w[torch.from_numpy(order)])
    gate, up = got.chunk(2)  # Megatron mlp.py: chunk(x, 2) -> act(gate) * up
    assert torch.equal(gate, w[0::2])
    assert torch.equal(up, w[1::2])


def test_expert_chain_gives_per_expert_transposes():
    w1 = _t(4, 6, 10)  # [E, H, 2F]
    chain = (Transpose(), Unstack())
    per_expert = apply_chain(chain, [w1])
    assert all(torch.equal(per_expert[e], w1[e].T) for e in range(4))
    assert chain_shapes(chain, [(4, 6, 10)]) == [(10, 6)] * 4
    assert same_bits(apply_chain(inverse_chain(chain), per_expert)[0], w1)


@pytest.mark.parametrize(("op", "shapes", "message"), [
    (DeinterleaveRows(), [(7, 3)], "odd"),
    (Split(0, (4, 5)), [(10, 3)], "needs size 9"),
    (Squeeze(1), [(6, 2, 4)], "cannot squeeze"),
    (Concat(0, (2, 2)), [(2, 4), (2, 5)], "cannot take"),
    (Concat(0, (2, 2)), [(2, 4)], "got 1"),
    (Stack(), [(2, 4), (2, 5)], "equal shapes"),
    (Reshape((8, 3), (24,)), [(3, 8)], "expects"),
    (Transpose((0, 3)), [(2, 4)], "out of range"),
])
def test_shape_errors_name_the_problem(op, shapes, message):
    with pytest.raises(ShapeError, match=message):
        op.shapes(shapes)
