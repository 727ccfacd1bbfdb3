"""The CPU lab's kernel replacements: each original really has no CPU kernel in MindSpore 2.10, and each
replacement computes the op's documented formula (written here in numpy).

The replacements are built and called directly (`Replacement.build()`); nothing is installed into this test
process, so no other test sees a patched MindSpore.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # MindSpore kernels on the CPU, each against its documented formula

ms = pytest.importorskip("mindspore")

from alignflow.labs.mindformers_cpu import kernels  # noqa: E402

REPS = {r.op: r for r in kernels.REPLACEMENTS}
rng = np.random.RandomState(0)
X = rng.randn(3, 5).astype(np.float32)
T = ms.Tensor(X)


def _original(entry: str) -> Any:
    owner, name = kernels._resolve(entry)
    return getattr(owner, name)


def _np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# op -> (call with a function f, numpy expectation)
CASES: dict[str, tuple[Callable[[Any], Any], Callable[[], np.ndarray]]] = {
    "FillScalar": (lambda f: f((2, 3), 2.5), lambda: np.full((2, 3), 2.5, np.float32)),
    "OnesLikeExt": (lambda f: f(T), lambda: np.ones_like(X)),
    "ZerosLikeExt": (lambda f: f(T), lambda: np.zeros_like(X)),
    "Arange": (lambda f: f(2, 11, 3), lambda: np.arange(2, 11, 3)),
    "Clone": (lambda f: f(T), lambda: X),
    "TrilExt": (lambda f: f(T, 1), lambda: np.tril(X, 1)),
    "IndexSelect": (lambda f: f(T, 1, ms.Tensor([4, 0, 0])), lambda: X[:, [4, 0, 0]]),
    "Embedding": (lambda f: f(ms.Tensor([[2, 0], [1, 1]]), T), lambda: X[[[2, 0], [1, 1]]]),
    "StackExt": (lambda f: f([T, T * 2], 1), lambda: np.stack([X, X * 2], 1)),
    "ScatterAddExt": (lambda f: f(T, 1, ms.Tensor([[0], [4], [2]]), ms.Tensor(np.ones((3, 1), np.float32))),
                      lambda: X + np.eye(5, dtype=np.float32)[[0, 4, 2]]),
    "RepeatInterleaveInt": (lambda f: f(T, 2, 0), lambda: np.repeat(X, 2, 0)),
    "AddcmulExt": (lambda f: f(T, T, T, value=0.5), lambda: X + 0.5 * X * X),
    "Outer": (lambda f: f(T[0], T[1]), lambda: np.outer(X[0], X[1])),
    "Baddbmm": (lambda f: f(ms.Tensor(np.ones((1, 3, 3), np.float32)), T.reshape(1, 3, 5), T.reshape(1, 3, 5)
                            .transpose(0, 2, 1), beta=0.5, alpha=2.0),
                lambda: 0.5 + 2.0 * (X @ X.T)[None]),
    "LinalgVectorNorm": (lambda f: f(T, 2, 1), lambda: np.linalg.norm(X, 2, 1)),
    "LogSoftmaxExt": (lambda f: f(T, 1), lambda: np.log(_np_softmax(X, 1))),
    "LogSumExp": (lambda f: f(T, 1, True), lambda: np.log(np.exp(X).sum(1, keepdims=True))),
    "RmsNorm": (lambda f: f(T, ms.Tensor(np.arange(5, dtype=np.float32)), 1e-6)[0],
                lambda: X / np.sqrt((X * X).mean(-1, keepdims=True) + 1e-6) * np.arange(5)),
    "DropoutExt": (lambda f: f(T, 0.0, True), lambda: X),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_replacement_follows_the_documented_formula(op: str) -> None:
    call, expected = CASES[op]
    got = call(REPS[op].build())
    np.testing.assert_allclose(got.asnumpy(), expected(), rtol=1e-5, atol=1e-6)


# Ops the lab replaces because MindSpore 2.10 has no CPU kernel for them: the original must fail on CPU. If a
# MindSpore release adds the kernel, this test says so, and the replacement can go.
@pytest.mark.parametrize("op", sorted(set(CASES) - {"Arange", "DropoutExt"}))
def test_the_original_has_no_cpu_kernel(op: str) -> None:
    call, _ = CASES[op]
    with pytest.raises(RuntimeError, match=r"unregistered|kernelmod"):
        call(_original(REPS[op].entry)).asnumpy()


@pytest.mark.parametrize(("op", "call"), [
    ("InplaceFillScalar", lambda t: t.fill_(1.0)),
    ("InplaceZero", lambda t: t.zero_()),
    ("InplaceNormal", lambda t: t.normal_(0.0, 1.0)),
    ("InplaceUniform", lambda t: t.uniform_(0.0, 1.0)),
])
def test_inplace_initialisers_have_no_cpu_kernel(op: str, call: Callable[[Any], Any]) -> None:
    with pytest.raises(RuntimeError, match=r"unregistered|kernelmod"):
        call(ms.Tensor(np.zeros((4, 4), np.float32))).asnumpy()


def test_inplace_fill_and_zero_write_into_the_tensor() -> None:
    t = ms.Tensor(np.zeros((4, 4), np.float32))
    assert REPS["InplaceFillScalar"].build()(t, 3.0) is t or np.all(t.asnumpy() == 3.0)
    np.testing.assert_array_equal(t.asnumpy(), np.full((4, 4), 3.0))
    REPS["InplaceZero"].build()(t)
    np.testing.assert_array_equal(t.asnumpy(), np.zeros((4, 4)))


def test_inplace_normal_and_uniform_draw_the_documented_distributions() -> None:
    t = ms.Tensor(np.zeros((200, 200), np.float32))
    REPS["InplaceNormal"].build()(t, mean=1.0, std=0.01)
    values = t.asnumpy()
    assert abs(values.mean() - 1.0) < 1e-3
    assert abs(values.std() - 0.01) < 1e-3
    REPS["InplaceUniform"].build()(t, -2.0, 2.0)
    values = t.asnumpy()
    assert values.min() >= -2.0
    assert values.max() < 2.0
    assert abs(values.mean()) < 0.05


def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """softmax(q k^T * scale, causal) v in [B, N, S, D]; GQA heads share their group's k/v."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    s = q @ k.transpose(0, 1, 3, 2) * scale
    s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
    return _np_softmax(s) @ v


@pytest.mark.parametrize(("layout", "heads", "kv_heads"), [("BNSD", 4, 4), ("BNSD", 4, 2), ("BSH", 4, 4),
                                                           ("SBH", 4, 2)])
def test_flash_attention_score_is_causal_softmax_attention(layout: str, heads: int, kv_heads: int) -> None:
    b, s, d = 2, 6, 8
    q, k, v = (rng.randn(b, n, s, d).astype(np.float32) for n in (heads, kv_heads, kv_heads))

    def to_layout(x: np.ndarray) -> Any:
        if layout == "BNSD":
            return ms.Tensor(x)
        bsh = x.transpose(0, 2, 1, 3).reshape(b, s, -1)
        return ms.Tensor(bsh.transpose(1, 0, 2) if layout == "SBH" else bsh)

    fa = REPS["FlashAttentionScore"].build()(head_num=heads, scale_value=0.3, pre_tokens=2147483647,
                                             next_tokens=0, input_layout=layout, sparse_mode=0)
    out = fa(to_layout(q), to_layout(k), to_layout(v))[3].asnumpy()
    expected = _np_attention(q, k, v, 0.3)
    if layout != "BNSD":
        expected = expected.transpose(0, 2, 1, 3).reshape(b, s, -1)
        expected = expected.transpose(1, 0, 2) if layout == "SBH" else expected
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)  # fp32 sums in another order


def test_flash_attention_explicit_mask_discards_ones() -> None:
    q = rng.randn(1, 1, 4, 8).astype(np.float32)
    mask = np.triu(np.ones((4, 4), np.uint8), 1)  # the causal mask MindFormers passes with sparse_mode 2/3
    fa = REPS["FlashAttentionScore"].build()(head_num=1, scale_value=1.0, next_tokens=2147483647,
                                             input_layout="BNSD", sparse_mode=0)
    out = fa(ms.Tensor(q), ms.Tensor(q), ms.Tensor(q), attn_mask=ms.Tensor(mask))[3].asnumpy()
    np.testing.assert_allclose(out, _np_attention(q, q, q, 1.0), rtol=1e-5, atol=1e-6)


def test_to_empty_gives_meta_parameters_cpu_storage() -> None:
    with ms.DeviceCtx("meta"):
        cell = ms.nn.Dense(3, 2)
    REPS["EmptyLike(meta->CPU)"].build()(cell)
    for param in cell.get_parameters():
        param.asnumpy()  # a meta tensor has no data and raises here


def test_every_replacement_is_documented() -> None:
    doc = kernels.__doc__ or ""
    assert "Why they are missing" in doc
    assert "What is patched" in doc
    for rep in kernels.REPLACEMENTS:
        assert rep.op
        assert rep.entry
        assert rep.composition


def _rotate_half_grad(split: Callable[..., Any]) -> np.ndarray:
    """d/dx sum(cat(-x2, x1) * w) with x1, x2 = split(x): RoPE's rotate_half."""
    w = ms.Tensor(rng.randn(4, 16).astype(np.float32))

    def f(x: Any) -> Any:
        a, b = split(x, 8, -1)
        return (ms.mint.cat((ms.mint.neg(b), a), -1) * w).sum()

    grad = ms.grad(f)(ms.Tensor(rng.randn(4, 16).astype(np.float32))).asnumpy()
    wn = w.asnumpy()
    np.testing.assert_allclose(grad[:, :8], wn[:, 8:], atol=1e-6)  # d/dx1 = w2, d/dx2 = -w1
    np.testing.assert_allclose(grad[:, 8:], -wn[:, :8], atol=1e-6)
    return grad


def test_split_replacement_differentiates_rotate_half_correctly() -> None:
    _rotate_half_grad(REPS["SplitTensor"].build())


def test_mindspore_cpu_split_backward_is_wrong_which_is_why_it_is_replaced() -> None:
    with pytest.raises(AssertionError):
        _rotate_half_grad(ms.mint.split)
