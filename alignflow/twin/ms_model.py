# mypy: allow-subclassing-any
"""The MindSpore twin (the "NPU" side): MindFormers PyNative parameter names and layouts.

Layouts reproduced on purpose, because they are what the converter must undo (docs/mindformers.md#weight-layout-traps):
dense and shared-expert `linear_fc1` rows interleaved `[g0, u0, g1, u1, ...]`; routed experts stored as
`experts.weight1 [E, H, 2F]` (`[gate | up]` halves of the last dim) and `experts.weight2 [E, F, H]`; the
aux-loss-free `mlp.expert_bias` and the `mlp.tokens_per_expert` counter on the MoE layer; no `model.` prefix.

Computation is fp32 (MindSpore's CPU kernels have no bf16 matmul). Shapes are static — every expert runs on
every token and the router's dense probabilities (zero where not routed) combine them — so the step can be
compiled with `mindspore.jit`; the result equals dispatching only the routed tokens.
"""

from __future__ import annotations

import math
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from alignflow.twin.presets import MoESpec, TwinSpec

MASK_VALUE = -10000.0  # Megatron's attention_mask_func fill value; exp() of it is exactly 0 in fp32


def _param(shape: tuple[int, ...], std: float | None, *, requires_grad: bool = True) -> Parameter:
    if std is None:
        value = Tensor(np.ones(shape, np.float32))
    elif std == 0.0:
        value = Tensor(np.zeros(shape, np.float32))
    else:
        value = initializer(Normal(sigma=std), shape, ms.float32).init_data()
    return Parameter(value, requires_grad=requires_grad)


def _linear(x: Tensor, weight: Tensor) -> Tensor:
    """`x @ weight.T` for `x [T, in]`, `weight [out, in]` (MindSpore/Megatron linear layout)."""
    return ops.matmul(x, weight.T)


class RMSNorm(nn.Cell):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = _param((size,), None)
        self.eps = eps

    def construct(self, x: Tensor) -> Tensor:
        return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps) * self.weight


class Linear(nn.Cell):
    def __init__(self, out_features: int, in_features: int, std: float) -> None:
        super().__init__()
        self.weight = _param((out_features, in_features), std)

    def construct(self, x: Tensor) -> Tensor:
        return _linear(x, self.weight)


class WordEmbeddings(nn.Cell):
    def __init__(self, vocab: int, hidden: int, std: float) -> None:
        super().__init__()
        self.weight = _param((vocab, hidden), std)

    def construct(self, ids: Tensor) -> Tensor:
        return ops.gather(self.weight, ids, 0)


class Embedding(nn.Cell):
    def __init__(self, vocab: int, hidden: int, std: float) -> None:
        super().__init__()
        self.word_embeddings = WordEmbeddings(vocab, hidden, std)

    def construct(self, ids: Tensor) -> Tensor:
        return self.word_embeddings(ids)


def rope_tables(spec: TwinSpec) -> tuple[Tensor, Tensor]:
    """cos/sin `[s, 1, d]` for rotate-half RoPE (Megatron's default, non-interleaved), computed in fp32."""
    d = spec.head_dim
    inv_freq = 1.0 / (np.float32(spec.rotary_base) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    freqs = np.outer(np.arange(spec.seq_length, dtype=np.float32), inv_freq.astype(np.float32))
    emb = np.concatenate([freqs, freqs], axis=-1).astype(np.float32)
    return Tensor(np.cos(emb)[:, None, :]), Tensor(np.sin(emb)[:, None, :])


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = ops.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rotated * sin


class SelfAttention(nn.Cell):
    """GQA with the query-group-major fused `linear_qkv` (per group: q heads, then k, then v)."""

    def __init__(self, spec: TwinSpec, out_std: float) -> None:
        super().__init__()
        self.spec = spec
        h, d = spec.hidden_size, spec.head_dim
        self.linear_qkv = Linear(spec.qkv_rows, h, spec.init_std)
        self.linear_proj = Linear(h, spec.num_heads * d, out_std)
        self.scale = 1.0 / math.sqrt(d)
        self.qk_layernorm = spec.qk_layernorm
        if spec.qk_layernorm:  # MindFormers Qwen3: q_layernorm / k_layernorm over head_dim, before RoPE
            self.q_layernorm = RMSNorm(d, spec.norm_eps)
            self.k_layernorm = RMSNorm(d, spec.norm_eps)

    def construct(self, x: Tensor, batch: int, cos: Tensor, sin: Tensor, causal: Tensor) -> Tensor:
        s, ng, d = self.spec.seq_length, self.spec.num_query_groups, self.spec.head_dim
        rep = self.spec.num_heads // ng
        qkv = self.linear_qkv(x).reshape(batch, s, ng, (rep + 2) * d)
        q = qkv[..., : rep * d].reshape(batch, s, ng * rep, d)
        k = qkv[..., rep * d : (rep + 1) * d]
        v = qkv[..., (rep + 1) * d :]
        if self.qk_layernorm:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        q = _rotate(q, cos, sin).transpose(0, 2, 1, 3)
        k = ops.repeat_interleave(_rotate(k, cos, sin).transpose(0, 2, 1, 3), rep, 1)
        v = ops.repeat_interleave(v.transpose(0, 2, 1, 3), rep, 1)
        scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale
        probs = ops.softmax(ops.select(causal, scores, ops.full_like(scores, MASK_VALUE)), -1)
        ctx = ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(batch * s, -1)
        return self.linear_proj(ctx)


class FusedSwiGLU(nn.Cell):
    """MindFormers' `fusedswiglu` (`bias_swiglu_fusion`): SiLU(gate) * up with a custom backward, computed as
    megatron's `SwiGLUFunction` computes it (`swiglu_back`), so that both twins fuse alike. `interleaved`: gate and
    up alternate along the last axis's pairs `[..., F, 2]` (MindFormers' fc1 rows); else they are its halves."""

    def __init__(self, *, interleaved: bool, ffn: int) -> None:
        super().__init__()
        self.interleaved = interleaved
        self.ffn = ffn

    def _split(self, y: Tensor) -> tuple[Tensor, Tensor]:
        if self.interleaved:
            return y[..., 0], y[..., 1]
        return y[..., : self.ffn], y[..., self.ffn :]

    def construct(self, y: Tensor) -> Tensor:
        gate, up = self._split(y)
        return ops.silu(gate) * up

    def bprop(self, y: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        gate, up = self._split(y)
        sig = ops.sigmoid(gate)
        d_gate = dout * sig * (1 + gate * (1 - sig)) * up
        d_up = dout * ops.silu(gate)
        return (ops.stack((d_gate, d_up), -1) if self.interleaved else ops.cat((d_gate, d_up), -1),)


class InterleavedMLP(nn.Cell):
    """SwiGLU whose `linear_fc1` rows alternate gate/up (MindFormers PyNative `MLP`)."""

    def __init__(self, hidden: int, ffn: int, std: float, out_std: float, activation: str = "silu",
                 fused: bool = False) -> None:
        super().__init__()
        self.linear_fc1 = Linear(2 * ffn, hidden, std)
        self.linear_fc2 = Linear(hidden, ffn, out_std)
        self.ffn = ffn
        self.gelu = activation == "gelu"  # an injected bug (twin.faults)
        self.fused = fused and not self.gelu
        if self.fused:
            self.swiglu = FusedSwiGLU(interleaved=True, ffn=ffn)

    def construct(self, x: Tensor) -> Tensor:
        h = self.linear_fc1(x).reshape(-1, self.ffn, 2)
        if self.fused:
            return self.linear_fc2(self.swiglu(h))
        gate = ops.gelu(h[..., 0]) if self.gelu else ops.silu(h[..., 0])
        return self.linear_fc2(gate * h[..., 1])


class SharedExperts(InterleavedMLP):
    def __init__(self, hidden: int, ffn: int, gate: bool, std: float, out_std: float, activation: str = "silu",
                 fused: bool = False) -> None:
        super().__init__(hidden, ffn, std, out_std, activation, fused)
        self.use_gate = gate
        if gate:
            self.shared_experts_gate = Linear(1, hidden, std)

    def construct(self, x: Tensor) -> Tensor:
        out = super().construct(x)
        if self.use_gate:
            out = out * ops.sigmoid(self.shared_experts_gate(x))
        return out


class GroupedExperts(nn.Cell):
    """Routed experts as one grouped GEMM: `weight1 [E, H, 2F]`, `weight2 [E, F, H]`."""

    def __init__(self, hidden: int, moe: MoESpec, std: float, out_std: float, activation: str = "silu",
                 fused: bool = False) -> None:
        super().__init__()
        e, f = moe.num_experts, moe.ffn_hidden_size
        self.weight1 = _param((e, hidden, 2 * f), std)
        self.weight2 = _param((e, f, hidden), out_std)
        self.ffn = f
        self.gelu = activation == "gelu"  # an injected bug (twin.faults)
        self.fused = fused and not self.gelu
        if self.fused:
            self.swiglu = FusedSwiGLU(interleaved=False, ffn=f)

    def construct(self, x: Tensor, probs: Tensor) -> Tensor:
        h = ops.matmul(ops.broadcast_to(x, (self.weight1.shape[0], -1, -1)), self.weight1)
        if self.fused:
            act = self.swiglu(h)
        else:
            gate = ops.gelu(h[..., : self.ffn]) if self.gelu else ops.silu(h[..., : self.ffn])
            act = gate * h[..., self.ffn :]
        y = ops.matmul(act, self.weight2)
        return (probs.T.expand_dims(-1) * y).sum(0)


class MoELayer(nn.Cell):
    """Router (softmax top-k renormalised, or sigmoid + expert bias), routed and shared experts, aux loss."""

    def __init__(self, hidden: int, moe: MoESpec, std: float, out_std: float, activation: str = "silu",
                 fused: bool = False) -> None:
        super().__init__()
        self.moe = moe
        self.router = Linear(moe.num_experts, hidden, std)
        self.experts = GroupedExperts(hidden, moe, std, out_std, activation, fused)
        if moe.shared_ffn_hidden_size is not None:
            self.shared_experts = SharedExperts(hidden, moe.shared_ffn_hidden_size, moe.shared_expert_gate, std,
                                                out_std, activation, fused)
        if moe.expert_bias:
            self.expert_bias = _param((moe.num_experts,), 0.0, requires_grad=False)
        self.tokens_per_expert = _param((moe.num_experts,), 0.0, requires_grad=False)

    def _route(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        m, e = self.moe, self.moe.num_experts
        one, zero = Tensor(1.0, ms.float32), Tensor(0.0, ms.float32)
        if m.score_function == "softmax":
            aux_scores = ops.softmax(logits, -1)
            _, top = ops.topk(logits, m.topk)
            routed = ops.one_hot(top, e, one, zero).sum(1)
            # softmax over the selected logits only == renormalised top-k softmax (Megatron,
            # docs/seeds.md#moe-router-renormalisation-norm_topk_prob)
            probs = ops.softmax(ops.select(routed > 0, logits, ops.full_like(logits, -1e30)), -1) * routed
            if not m.norm_topk_prob:  # an injected bug (twin.faults): the top-k of the full softmax
                probs = aux_scores * routed
        else:
            scores = ops.sigmoid(logits)
            aux_scores = scores / (scores.sum(-1, keepdims=True) + 1e-20)
            _, top = ops.topk(scores + self.expert_bias if m.expert_bias else scores, m.topk)
            routed = ops.one_hot(top, e, one, zero).sum(1)
            picked = scores * routed
            probs = picked / (picked.sum(-1, keepdims=True) + 1e-20) if m.topk > 1 and m.norm_topk_prob else picked
        if m.topk_scaling_factor:
            probs = probs * m.topk_scaling_factor
        _, aux_top = ops.topk(aux_scores, m.topk)
        aux_routed = ops.one_hot(aux_top, e, one, zero).sum(1)
        return probs, routed.sum(0), aux_scores, ops.stop_gradient(aux_routed.sum(0))

    def construct(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = self.router(x)
        probs, counts, aux_scores, aux_counts = self._route(logits)
        out = self.experts(x, probs)
        if self.moe.shared_ffn_hidden_size is not None:
            out = out + self.shared_experts(x)
        n_tokens = x.shape[0]
        m = self.moe
        # Megatron switch_load_balancing_loss_func, without the coefficient (logged raw, scaled in the loss)
        aux = (aux_scores.sum(0) * aux_counts).sum() * (m.num_experts / (m.topk * n_tokens * n_tokens))
        return out, aux, ops.stop_gradient(counts)


class TransformerLayer(nn.Cell):
    def __init__(self, spec: TwinSpec, is_moe: bool) -> None:
        super().__init__()
        std, out_std = spec.init_std, spec.init_std / math.sqrt(2.0 * spec.num_layers)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.self_attention = SelfAttention(spec, out_std)
        self.pre_mlp_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.is_moe = is_moe
        fused = spec.bias_swiglu_fusion
        if is_moe:
            assert spec.moe is not None
            self.mlp: nn.Cell = MoELayer(spec.hidden_size, spec.moe, std, out_std, spec.activation, fused)
        else:
            self.mlp = InterleavedMLP(spec.hidden_size, spec.ffn_hidden_size, std, out_std, spec.activation, fused)
        if spec.recompute_num_layers:  # MindFormers `recompute: {mode: full}`: the layer is run again in backward
            self.recompute()

    def construct(self, x: Tensor, batch: int, cos: Tensor, sin: Tensor, causal: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
        h = x + self.self_attention(self.input_layernorm(x), batch, cos, sin, causal)
        if self.is_moe:
            out, aux, counts = self.mlp(self.pre_mlp_layernorm(h))
            return h + out, aux, counts
        return h + self.mlp(self.pre_mlp_layernorm(h)), Tensor(0.0, ms.float32), Tensor(0.0, ms.float32)


class Decoder(nn.Cell):
    def __init__(self, spec: TwinSpec) -> None:
        super().__init__()
        self.layers = nn.CellList([TransformerLayer(spec, spec.moe_layers[i]) for i in range(spec.num_layers)])
        self.final_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)


class MTPLayer(nn.Cell):
    """Megatron's MTP module: `eh_proj(cat(enorm(emb(shifted ids)), hnorm(h)))`, one layer, final norm."""

    def __init__(self, spec: TwinSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.enorm = RMSNorm(h, spec.norm_eps)
        self.hnorm = RMSNorm(h, spec.norm_eps)
        self.eh_proj = Linear(h, 2 * h, spec.init_std)
        self.transformer_layer = TransformerLayer(spec, spec.mtp_inner_is_moe)
        self.final_layernorm = RMSNorm(h, spec.norm_eps)


class MTP(nn.Cell):
    def __init__(self, spec: TwinSpec) -> None:
        super().__init__()
        self.layers = nn.CellList([MTPLayer(spec) for _ in range(spec.mtp_num_layers)])


def _shift_left(x: Tensor) -> Tensor:
    """`roll(x, -1, dim=1)` with the last column zeroed (Megatron `roll_tensor`; CPU has no Roll kernel)."""
    return ops.cat((x[:, 1:], ops.zeros_like(x[:, :1])), 1)


def _token_ce(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-token cross entropy `logsumexp(z) - z[label]` in fp32."""
    picked = ops.gather_elements(logits, 1, labels.reshape(-1, 1)).reshape(-1)
    return ops.logsumexp(logits, -1) - picked


class TwinGPTMindSpore(nn.Cell):
    """The whole twin model. `construct` returns the training objective and the logged pieces.

    Outputs: `(objective, lm_sum, mtp_sums [D], aux_raw [L_moe], counts [L_moe, E])` where the objective is
    Megatron's: mean lm CE + sum of per-layer aux losses (times the coefficient) + scale/D * sum of mtp means.
    `micro_scale` (1 / number of micro-batches) scales it as Megatron's schedules do.
    """

    def __init__(self, spec: TwinSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embedding = Embedding(spec.vocab_size, spec.hidden_size, spec.init_std)
        self.decoder = Decoder(spec)
        self.output_layer = Linear(spec.vocab_size, spec.hidden_size, spec.init_std)
        if spec.mtp_num_layers:
            self.mtp = MTP(spec)
        cos, sin = rope_tables(spec)
        self.cos, self.sin = cos, sin
        s = spec.seq_length
        self.causal = Tensor(np.tril(np.ones((s, s), dtype=np.bool_)))
        self.aux_coeff = spec.moe.aux_loss_coeff if spec.moe is not None else 0.0


    def moe_layers(self) -> list[MoELayer]:
        """MoE layers in the order the forward reports their counts (decoder, then MTP inner layers)."""
        layers = [*self.decoder.layers, *(m.transformer_layer for m in (self.mtp.layers if self.spec.mtp_num_layers
                                                                           else []))]
        return [layer.mlp for layer in layers if layer.is_moe]

    def construct(self, tokens: Tensor, labels: Tensor, micro_scale: Tensor) -> tuple[Any, ...]:
        batch = tokens.shape[0]
        # tuples, not lists: graph mode (mindspore.jit) unrolls the loops and drops list mutations
        aux: tuple[Tensor, ...] = ()
        counts: tuple[Tensor, ...] = ()
        x = self.embedding(tokens.reshape(-1))
        for layer in self.decoder.layers:
            x, layer_aux, layer_counts = layer(x, batch, self.cos, self.sin, self.causal)
            if layer.is_moe:
                aux, counts = (*aux, layer_aux), (*counts, layer_counts)
        hidden = self.decoder.final_layernorm(x)
        lm_sum = _token_ce(self.output_layer(hidden), labels.reshape(-1)).sum()
        objective = lm_sum / (labels.size * 1.0)
        mtp_sums: tuple[Tensor, ...] = ()
        ids, mtp_labels = tokens, labels
        mask = ops.ones(labels.shape, ms.float32)
        for k in range(self.spec.mtp_num_layers):
            layer = self.mtp.layers[k]
            ids, mtp_labels, mask = _shift_left(ids), _shift_left(mtp_labels), _shift_left(mask)
            emb = self.embedding(ids.reshape(-1))
            h = layer.eh_proj(ops.cat((layer.enorm(emb), layer.hnorm(hidden)), -1))
            h, layer_aux, layer_counts = layer.transformer_layer(h, batch, self.cos, self.sin, self.causal)
            if layer.transformer_layer.is_moe:
                aux, counts = (*aux, layer_aux), (*counts, layer_counts)
            hidden = layer.final_layernorm(h)
            ce_sum = (_token_ce(self.output_layer(hidden), mtp_labels.reshape(-1)) * mask.reshape(-1)).sum()
            mtp_sums = (*mtp_sums, ce_sum / mask.sum())
            objective = objective + self.spec.mtp_loss_scaling_factor / self.spec.mtp_num_layers * mtp_sums[-1]
        aux_raw = ops.stack(aux) if aux else ops.zeros((0,), ms.float32)
        if aux and self.aux_coeff:
            objective = objective + self.aux_coeff * aux_raw.sum()
        mtp_out = ops.stack(mtp_sums) if mtp_sums else ops.zeros((0,), ms.float32)
        count_out = ops.stack(counts) if counts else ops.zeros((0,), ms.float32)
        return objective * micro_scale, lm_sum, mtp_out, aux_raw, count_out
