"""CPU replacements for the MindSpore kernels MindFormers 2.1.0's PyNative trainer needs but MindSpore 2.10 ships
for Ascend only.

Why they are missing: MindSpore's PyNative ("pyboost") ops dispatch to a kernel registered per device; the ops
below are registered for Ascend (most are fused Ascend kernels: `RmsNorm`, the `*Ext` aten-style ops, the
in-place initialisers) and have no CPU kernel in MindSpore 2.10, so on CPU they fail with `The kernel <Op>
unregistered` (or `Create kernelmod for op <Op> failed`). Every replacement composes ops that do have CPU
kernels and are differentiable where the original is, following the formula the op's documentation gives
(https://www.mindspore.cn/docs/en/r2.7.0/api_python/mindspore.mint.html). `tests/lab/test_mindformers_kernels.py`
checks each one against that formula.

One replacement is of a kernel that exists on CPU but differentiates wrongly there (`mint.split`, see
`REPLACEMENTS`): without it the RoPE gradient of every attention layer is wrong and real MindFormers' grad norm
differed from Megatron's by 3 % at step 1 while the loss agreed to 4e-7.

What is patched: the Python entry points that dispatch each op (`mindspore.mint.*`, `mindspore.ops.*`,
`Tensor.*` methods), wherever MindSpore re-exports the same function object, *before* MindFormers is imported
(its cells keep references such as `self.norm = rms_norm` taken at import time). Nothing of MindFormers is
patched: its trainer, models, data pipeline, checkpointing and logging run as shipped.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The mindspore modules whose attributes are patched are found by identity: every loaded `mindspore.*` module
# holding the original function object gets the replacement (MindSpore re-exports one function under several
# namespaces, e.g. `mindspore.ops.rms_norm` and `mindspore.ops.function.nn_func.rms_norm`).


@dataclass(frozen=True, slots=True)
class Replacement:
    """One Ascend-only op and its CPU composition."""

    op: str  # MindSpore kernel name, as the `unregistered` error names it
    entry: str  # the Python entry point that dispatches it: "mint.full", "Tensor.fill_", ...
    composition: str  # what replaces it, in words
    build: Callable[[], Callable[..., Any]]  # returns the replacement (imports mindspore lazily)


def _ms() -> Any:
    import mindspore

    return mindspore


# ------------------------------------------------------------------------------------------ in-place init


def _fill_() -> Callable[..., Any]:
    ms = _ms()

    def fill_(self: Any, value: Any) -> Any:
        return self.copy_(ms.ops.fill(self.dtype, self.shape, float(value)))

    return fill_


def _zero_() -> Callable[..., Any]:
    ms = _ms()

    def zero_(self: Any) -> Any:
        return self.copy_(ms.ops.zeros_like(self))

    return zero_


def _normal_() -> Callable[..., Any]:
    ms = _ms()

    def normal_(self: Any, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Any:
        sample = ms.ops.standard_normal(tuple(self.shape)) * float(std) + float(mean)
        return self.copy_(sample.astype(self.dtype))

    return normal_


def _uniform_() -> Callable[..., Any]:
    ms = _ms()

    def uniform_(self: Any, from_: float = 0.0, to: float = 1.0, *, generator: Any = None) -> Any:
        low, high = ms.Tensor(float(from_), ms.float32), ms.Tensor(float(to), ms.float32)
        return self.copy_(ms.ops.uniform(tuple(self.shape), low, high).astype(self.dtype))

    return uniform_


# ------------------------------------------------------------------------------------------ creation


def _full() -> Callable[..., Any]:
    ms = _ms()

    def full(size: Any, fill_value: Any, *, dtype: Any = None) -> Any:
        shape = (size,) if isinstance(size, int) else tuple(size)
        value = fill_value.item() if isinstance(fill_value, ms.Tensor) else fill_value
        if dtype is None:
            dtype = ms.bool_ if isinstance(value, bool) else ms.int64 if isinstance(value, int) else ms.float32
        return ms.ops.fill(dtype, shape, value)

    return full


def _ones_like() -> Callable[..., Any]:
    ms = _ms()

    def ones_like(input: Any, *, dtype: Any = None) -> Any:
        out = ms.ops.ones_like(input)
        return out if dtype is None else out.astype(dtype)

    return ones_like


def _zeros_like() -> Callable[..., Any]:
    ms = _ms()

    def zeros_like(input: Any, *, dtype: Any = None) -> Any:
        out = ms.ops.zeros_like(input)
        return out if dtype is None else out.astype(dtype)

    return zeros_like


def _arange() -> Callable[..., Any]:
    ms = _ms()

    def arange(start: Any = 0, end: Any = None, step: Any = 1, *, dtype: Any = None) -> Any:
        if end is None:
            start, end = 0, start
        values = [v.item() if isinstance(v, ms.Tensor) else v for v in (start, end, step)]
        if dtype is None:
            dtype = ms.int64 if all(isinstance(v, int) for v in values) else ms.float32
        return ms.ops.arange(*values).astype(dtype)

    return arange


def _clone() -> Callable[..., Any]:
    ms = _ms()

    def clone(input: Any, *, memory_format: Any = None) -> Any:
        # `x * 1` allocates a new tensor with x's values and passes the gradient through unchanged
        return ms.ops.mul(input, ms.ops.ones_like(input))

    return clone


# ------------------------------------------------------------------------------------------ indexing/shape


def _tril() -> Callable[..., Any]:
    ms = _ms()

    def tril(input: Any, diagonal: int = 0) -> Any:
        return ms.ops.tril(input, diagonal)

    return tril


def _index_select() -> Callable[..., Any]:
    ms = _ms()

    def index_select(input: Any, dim: int, index: Any) -> Any:
        return ms.ops.gather(input, index, dim)

    return index_select


def _embedding() -> Callable[..., Any]:
    ms = _ms()

    def embedding(input: Any, weight: Any, padding_idx: Any = None, max_norm: Any = None, norm_type: float = 2.0,
                  scale_grad_by_freq: bool = False) -> Any:
        if max_norm is not None or scale_grad_by_freq:
            raise NotImplementedError("CPU lab embedding: max_norm and scale_grad_by_freq are not replaced")
        return ms.ops.gather(weight, input, 0)

    return embedding


def _stack() -> Callable[..., Any]:
    ms = _ms()

    def stack(tensors: Any, dim: int = 0) -> Any:
        return ms.ops.stack(tuple(tensors), dim)

    return stack


def _scatter_add() -> Callable[..., Any]:
    ms = _ms()

    def scatter_add(input: Any, dim: int, index: Any, src: Any) -> Any:
        return ms.ops.tensor_scatter_elements(input, index, src, dim, "add")

    return scatter_add


def _repeat_interleave() -> Callable[..., Any]:
    ms = _ms()

    def repeat_interleave(input: Any, repeats: Any, dim: Any = None, *, output_size: Any = None) -> Any:
        if not isinstance(repeats, int):
            return ms.ops.repeat_elements(input, int(repeats), 0 if dim is None else dim)
        x = input.reshape(-1) if dim is None else input
        axis = 0 if dim is None else dim % x.ndim
        expanded = ms.ops.broadcast_to(x.unsqueeze(axis + 1), (*x.shape[: axis + 1], repeats, *x.shape[axis + 1:]))
        return expanded.reshape(*x.shape[:axis], x.shape[axis] * repeats, *x.shape[axis + 1:])

    return repeat_interleave


# ------------------------------------------------------------------------------------------ arithmetic


def _addcmul() -> Callable[..., Any]:
    def addcmul(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Any:
        return input + tensor1 * tensor2 * value

    return addcmul


def _outer() -> Callable[..., Any]:
    def outer(input: Any, vec2: Any) -> Any:
        return input.reshape(-1, 1) * vec2.reshape(1, -1)

    return outer


def _baddbmm() -> Callable[..., Any]:
    ms = _ms()

    def baddbmm(input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
        return input * beta + ms.ops.bmm(batch1, batch2) * alpha

    return baddbmm


def _vector_norm() -> Callable[..., Any]:
    ms = _ms()

    def vector_norm(x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
        v = x if dtype is None else x.astype(dtype)
        axis = () if dim is None else dim
        a = ms.ops.abs(v)
        if ord == float("inf"):
            return ms.ops.amax(a, axis, keepdim)
        if ord == float("-inf"):
            return ms.ops.amin(a, axis, keepdim)
        if ord == 0:
            return ms.ops.sum((a != 0).astype(v.dtype), axis, keepdim)
        if ord == 2:
            return ms.ops.sqrt(ms.ops.sum(v * v, axis, keepdim))
        return ms.ops.pow(ms.ops.sum(ms.ops.pow(a, ord), axis, keepdim), 1.0 / ord)

    return vector_norm


def _log_softmax() -> Callable[..., Any]:
    ms = _ms()

    def log_softmax(input: Any, dim: Any = None, *, dtype: Any = None) -> Any:
        x = input if dtype is None else input.astype(dtype)
        axis = -1 if dim is None else dim
        shifted = x - ms.ops.stop_gradient(ms.ops.amax(x, axis, True))
        return shifted - ms.ops.log(ms.ops.sum(ms.ops.exp(shifted), axis, True))

    return log_softmax


def _logsumexp() -> Callable[..., Any]:
    ms = _ms()

    def logsumexp(input: Any, dim: Any, keepdim: bool = False) -> Any:
        top = ms.ops.stop_gradient(ms.ops.amax(input, dim, True))
        out = ms.ops.log(ms.ops.sum(ms.ops.exp(input - top), dim, True)) + top
        return out if keepdim else out.squeeze(dim)

    return logsumexp


def _dropout() -> Callable[..., Any]:
    ms = _ms()

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        # Dropout: zero each element with probability p and scale the kept ones by 1/(1-p); identity when p == 0
        # or not training (alignment runs use p = 0: hidden_dropout and attention_dropout must be 0)
        if not training or p == 0:
            return input
        keep = (ms.ops.uniform(tuple(input.shape), ms.Tensor(0.0, ms.float32), ms.Tensor(1.0, ms.float32)) >= p)
        return input * keep.astype(input.dtype) / (1.0 - p)

    return dropout


def _split() -> Callable[..., Any]:
    ms = _ms()

    def split(tensor: Any, split_size_or_sections: Any, dim: int = 0) -> Any:
        # the Split primitive (not a view): pieces of `split_size` (the last may be smaller) or of the given sizes
        return ms.ops.split(tensor, split_size_or_sections, dim)

    return split


def _rms_norm() -> Callable[..., Any]:
    ms = _ms()

    def rms_norm(x: Any, gamma: Any, epsilon: float = 1e-6) -> tuple[Any, Any]:
        # RmsNorm: y = x / sqrt(mean(x^2, last axis) + eps) * gamma; second output rstd = 1/sqrt(mean + eps)
        rstd = ms.ops.rsqrt(ms.ops.mean(x * x, -1, True) + epsilon)
        return x * rstd * gamma, rstd

    return rms_norm


def _swiglu() -> Callable[..., Any]:
    ms = _ms()

    def swiglu(input: Any, dim: int = -1) -> Any:
        # Swiglu: split the input in two halves a, b along `dim`; out = silu(a) * b
        a, b = ms.ops.chunk(input, 2, dim)
        return a * ms.ops.sigmoid(a) * b

    return swiglu


def _flash_attention_score() -> Callable[..., Any]:
    ms = _ms()

    class FlashAttentionScore:
        """FlashAttentionScore as plain attention: softmax(q k^T * scale, masked) v.

        Documented semantics (mindspore.ops.flash_attention_score): `attn_mask` 1 = position discarded; with
        sparse_mode 0/1 query i attends to keys j with i - pre_tokens <= j <= i + next_tokens (next_tokens 0 =
        causal); sparse_mode 2 (left-up) and 3 (right-down) are causal, the same for equal q/kv lengths; keys
        and values may have fewer heads than the query (GQA: group g serves heads g*N/Nkv..). Outputs
        (softmax_max, softmax_sum, softmax_out, attention_out) with the two statistics [B, N, S, 8] in fp32, as
        the kernel returns them; softmax_out is unused by the kernel and returned empty.
        """

        def __init__(self, head_num: int, keep_prob: float = 1.0, scale_value: float = 1.0,
                     pre_tokens: int = 2147483647, next_tokens: int = 2147483647, inner_precise: int = 0,
                     input_layout: str = "BSH", sparse_mode: int = 0) -> None:
            if keep_prob != 1.0:
                raise NotImplementedError("CPU lab FlashAttentionScore: attention dropout (keep_prob < 1)")
            if input_layout not in ("BNSD", "BSH", "SBH", "BSND"):
                raise NotImplementedError(f"CPU lab FlashAttentionScore: input_layout {input_layout}")
            if sparse_mode not in (0, 1, 2, 3):
                raise NotImplementedError(f"CPU lab FlashAttentionScore: sparse_mode {sparse_mode}")
            self.head_num, self.scale = head_num, scale_value
            self.pre_tokens, self.next_tokens = pre_tokens, next_tokens
            self.layout, self.sparse_mode = input_layout, sparse_mode

        def _to_bnsd(self, x: Any, heads: int | None) -> Any:
            if self.layout == "BNSD":
                return x
            if self.layout == "BSND":
                return x.transpose(0, 2, 1, 3)
            if self.layout == "SBH":
                x = x.transpose(1, 0, 2)
            b, s, h = x.shape
            n = heads if heads is not None else h // (self._head_dim or h)
            return x.reshape(b, s, n, h // n).transpose(0, 2, 1, 3)

        def _from_bnsd(self, x: Any) -> Any:
            if self.layout == "BNSD":
                return x
            if self.layout == "BSND":
                return x.transpose(0, 2, 1, 3)
            b, n, s, d = x.shape
            y = x.transpose(0, 2, 1, 3).reshape(b, s, n * d)
            return y.transpose(1, 0, 2) if self.layout == "SBH" else y

        _head_dim: int | None = None

        def __call__(self, query: Any, key: Any, value: Any, real_shift: Any = None, drop_mask: Any = None,
                     padding_mask: Any = None, attn_mask: Any = None, prefix: Any = None,
                     actual_seq_qlen: Any = None, actual_seq_kvlen: Any = None) -> tuple[Any, Any, Any, Any]:
            if actual_seq_qlen is not None or actual_seq_kvlen is not None or prefix is not None:
                raise NotImplementedError("CPU lab FlashAttentionScore: actual_seq_*len / prefix (TND, EOD masks)")
            if self.layout in ("BSH", "SBH"):
                self._head_dim = query.shape[-1] // self.head_num
            q = self._to_bnsd(query, self.head_num)
            k, v = self._to_bnsd(key, None), self._to_bnsd(value, None)
            n, nkv, sq, skv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
            if nkv != n:
                k = ms.ops.repeat_elements(k, n // nkv, 1)
                v = ms.ops.repeat_elements(v, n // nkv, 1)
            scores = ms.ops.bmm(q.astype(ms.float32).reshape(-1, sq, q.shape[3]),
                                k.astype(ms.float32).reshape(-1, skv, k.shape[3]).transpose(0, 2, 1))
            scores = scores.reshape(q.shape[0], n, sq, skv) * self.scale
            if real_shift is not None:
                scores = scores + real_shift.astype(ms.float32)
            i = ms.ops.arange(sq).reshape(-1, 1)
            j = ms.ops.arange(skv).reshape(1, -1)
            if self.sparse_mode in (2, 3):
                offset = 0 if self.sparse_mode == 2 else skv - sq
                masked = j > i + offset
            else:
                masked = ms.ops.logical_or(j > i + self.next_tokens, j < i - self.pre_tokens)
            if attn_mask is not None and self.sparse_mode in (0, 1):
                masked = ms.ops.logical_or(masked, attn_mask.astype(ms.bool_))
            scores = ms.ops.masked_fill(scores, ms.ops.broadcast_to(masked, scores.shape), ms.Tensor(-1e30,
                                                                                                   ms.float32))
            row_max = ms.ops.stop_gradient(ms.ops.amax(scores, -1, True))
            weights = ms.ops.exp(scores - row_max)
            row_sum = ms.ops.sum(weights, -1, True)
            probs = weights / row_sum
            out = ms.ops.bmm(probs.reshape(-1, sq, skv), v.astype(ms.float32).reshape(-1, skv, v.shape[3]))
            out = out.reshape(q.shape[0], n, sq, v.shape[3]).astype(query.dtype)
            stats = (ms.ops.broadcast_to(row_max, (*row_max.shape[:-1], 8)),
                     ms.ops.broadcast_to(ms.ops.stop_gradient(row_sum), (*row_sum.shape[:-1], 8)))
            return stats[0], stats[1], ms.ops.zeros((0,), query.dtype), self._from_bnsd(out)

    return FlashAttentionScore


def _to_empty() -> Callable[..., Any]:
    ms = _ms()
    original = ms.nn.Cell.to_empty

    def to_empty(self: Any, *, device: Any = None, recurse: bool = True) -> Any:
        # MindSpore 2.10's `empty_like(t, device=None)` keeps a meta tensor on the meta device on CPU, so the
        # trainer's `model.to_empty()` would leave every parameter without storage: name the device explicitly.
        return original(self, device=device or ms.get_context("device_target"), recurse=recurse)

    return to_empty


REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement("InplaceFillScalar", "Tensor.fill_", "copy_ of ops.fill (FillV2)", _fill_),
    Replacement("InplaceZero", "Tensor.zero_", "copy_ of ops.zeros_like", _zero_),
    Replacement("InplaceNormal", "Tensor.normal_", "copy_ of ops.standard_normal * std + mean", _normal_),
    Replacement("InplaceUniform", "Tensor.uniform_", "copy_ of ops.uniform(from, to)", _uniform_),
    Replacement("FillScalar", "mint.full", "ops.fill (FillV2)", _full),
    Replacement("OnesLikeExt", "mint.ones_like", "ops.ones_like, cast to dtype", _ones_like),
    Replacement("ZerosLikeExt", "mint.zeros_like", "ops.zeros_like, cast to dtype", _zeros_like),
    Replacement("Arange", "mint.arange", "ops.arange (Range), cast to dtype", _arange),
    Replacement("Clone", "mint.clone", "x * ones_like(x) (a new tensor, identity gradient)", _clone),
    Replacement("TrilExt", "mint.tril", "ops.tril (Tril)", _tril),
    Replacement("IndexSelect", "mint.index_select", "ops.gather(input, index, dim)", _index_select),
    Replacement("Embedding", "mint.nn.functional.embedding", "ops.gather(weight, ids, 0)", _embedding),
    Replacement("StackExt", "mint.stack", "ops.stack (Stack)", _stack),
    Replacement("ScatterAddExt", "mint.scatter_add", "ops.tensor_scatter_elements(..., 'add')", _scatter_add),
    Replacement("RepeatInterleaveInt", "mint.repeat_interleave", "unsqueeze, broadcast_to, reshape",
                _repeat_interleave),
    Replacement("AddcmulExt", "mint.addcmul", "input + tensor1 * tensor2 * value", _addcmul),
    Replacement("Outer", "mint.outer", "column vector times row vector", _outer),
    Replacement("Baddbmm", "mint.baddbmm", "beta * input + alpha * ops.bmm", _baddbmm),
    Replacement("LinalgVectorNorm", "mint.linalg.vector_norm", "(sum |x|^p)^(1/p); sqrt(sum x^2); max/min |x|",
                _vector_norm),
    Replacement("LogSoftmaxExt", "mint.nn.functional.log_softmax", "x - max - log(sum(exp(x - max)))",
                _log_softmax),
    Replacement("LogSumExp", "mint.logsumexp", "log(sum(exp(x - max))) + max", _logsumexp),
    Replacement("DropoutExt", "mint.nn.functional.dropout", "identity at p = 0; else uniform mask / (1 - p)",
                _dropout),
    Replacement("FlashAttentionScore", "ops.operations.nn_ops.FlashAttentionScore",
                "softmax(q k^T * scale + masks) v in fp32 (BNSD/BSH/SBH/BSND, causal bands, GQA)",
                _flash_attention_score),
    # Not missing but wrong: MindSpore 2.10's CPU backward of mint.split (the SplitTensor/SplitWithSize view
    # ops) returns wrong gradients once the pieces are concatenated in another order, which is exactly RoPE's
    # rotate_half (cat(-x2, x1)); ops.split's Split primitive differentiates correctly (tests/lab shows both).
    Replacement("SplitTensor", "mint.split", "ops.split (the Split primitive, not a view)", _split),
    Replacement("RmsNorm", "ops.rms_norm", "x * rsqrt(mean(x^2) + eps) * gamma, and rstd", _rms_norm),
    Replacement("Swiglu", "ops.swiglu", "silu(first half) * second half", _swiglu),
    # Not a kernel: the device default of delayed initialisation (meta device -> real storage).
    Replacement("EmptyLike(meta->CPU)", "nn.Cell.to_empty", "to_empty(device=<context device_target>)", _to_empty),
)


def _resolve(entry: str) -> tuple[Any, str]:
    ms = _ms()
    owner_path, _, name = entry.rpartition(".")
    owner: Any = ms.Tensor if owner_path == "Tensor" else ms.nn.Cell if owner_path == "nn.Cell" else ms
    if owner_path not in ("Tensor", "nn.Cell"):
        for part in owner_path.split("."):
            owner = getattr(owner, part)
    return owner, name


_INSTALLED: dict[str, Any] = {}


def install() -> list[str]:
    """Patch every entry point of `REPLACEMENTS`; returns the kernels replaced. Idempotent."""
    if _INSTALLED:
        return sorted(_INSTALLED)
    ms = _ms()
    for rep in REPLACEMENTS:
        owner, name = _resolve(rep.entry)
        original = getattr(owner, name)
        replacement = rep.build()
        replacement.__doc__ = f"CPU lab replacement of {rep.op} ({rep.entry}): {rep.composition}."
        if owner is ms.Tensor or owner is ms.nn.Cell:
            setattr(owner, name, replacement)
        else:
            for module in [m for n, m in list(sys.modules.items()) if n.startswith("mindspore") and m is not None]:
                for attr, value in list(vars(module).items()):
                    if value is original:
                        setattr(module, attr, replacement)
        _INSTALLED[rep.op] = original
    return sorted(_INSTALLED)
