"""The PyTorch twin (the "GPU" side): megatron-core `GPTModel` parameter names, local-spec module tree.

The module tree is Megatron's local spec, so `state_dict()` yields exactly the megatron-core names
(`decoder.layers.{i}.self_attention.linear_qkv.weight`, `mlp.experts.local_experts.{e}.linear_fc1.weight`
with `[gate; up]` rows, `mlp.router.expert_bias`, `mlp.shared_experts.gate_weight`, MTP `transformer_layer`
or `mtp_model_layer`), including the `_extra_state: None` entries of the local linears and their load hook
(docs/megatron.md#where-_extra_state-keys-come-from). The Transformer-Engine names are a renaming of these
(`flavours.py`).

Computation is fp32 and follows megatron-core 0.16: rotate-half RoPE, `-10000` causal fill, router top-k
with a softmax over the selected logits (or sigmoid + expert bias), Switch-style aux loss, sigmoid-gated
shared expert, MTP on the final-normed hidden states.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from alignflow.twin.presets import MoESpec, TwinSpec
from alignflow.twin.torch_parallel import TensorParallel

MASK_VALUE = -10000.0
NO_TP = TensorParallel()  # one tensor-parallel rank: every mapping is the identity


class Linear(nn.Module):
    """A bias-free linear layer with Megatron's local `_extra_state` (always None) and its load hook."""

    def __init__(self, out_features: int, in_features: int, std: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.normal_(self.weight, 0.0, std)
        self.register_load_state_dict_pre_hook(_setdefault_extra_state)  # type: ignore[no-untyped-call]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)

    def get_extra_state(self) -> None:
        return None

    def set_extra_state(self, state: Any) -> None:
        return None


def _setdefault_extra_state(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    state_dict.setdefault(prefix + "_extra_state")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Embedding(nn.Module):
    """megatron `VocabParallelEmbedding`: this rank's rows of the vocabulary, zero for the others' ids, summed."""

    def __init__(self, vocab: int, hidden: int, std: float, tp: TensorParallel = NO_TP) -> None:
        super().__init__()
        self.tp, (self.start, self.end) = tp, tp.split(vocab)
        self.word_embeddings = nn.Embedding(self.end - self.start, hidden)
        nn.init.normal_(self.word_embeddings.weight, 0.0, std)

    def forward(self, ids: Tensor) -> Tensor:
        if self.tp.size == 1:
            out: Tensor = self.word_embeddings(ids)
            return out
        outside = (ids < self.start) | (ids >= self.end)
        local = self.word_embeddings((ids - self.start).masked_fill(outside, 0))
        return self.tp.reduce_from(local.masked_fill(outside.unsqueeze(-1), 0.0))


def rope_tables(spec: TwinSpec, device: torch.device) -> tuple[Tensor, Tensor]:
    """Megatron `RotaryEmbedding`: `inv_freq = 1 / base^(2i/d)`, emb = cat(freqs, freqs), fp32."""
    d = spec.head_dim
    inv_freq = 1.0 / (spec.rotary_base ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    freqs = torch.outer(torch.arange(spec.seq_length, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:, None, :], emb.sin()[:, None, :]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class SelfAttention(nn.Module):
    """Column-parallel `linear_qkv` (whole query groups per rank), row-parallel `linear_proj`."""

    def __init__(self, spec: TwinSpec, out_std: float, tp: TensorParallel = NO_TP) -> None:
        super().__init__()
        self.spec, self.tp = spec, tp
        self.groups = spec.num_query_groups // tp.size
        self.linear_qkv = Linear(spec.qkv_rows // tp.size, spec.hidden_size, spec.init_std)
        self.linear_proj = Linear(spec.hidden_size, spec.num_heads * spec.head_dim // tp.size, out_std)
        self.norm_factor = math.sqrt(spec.head_dim)
        if spec.qk_layernorm:  # megatron SelfAttention: q_layernorm / k_layernorm over head_dim, before RoPE
            self.q_layernorm = RMSNorm(spec.head_dim, spec.norm_eps)
            self.k_layernorm = RMSNorm(spec.head_dim, spec.norm_eps)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], causal: Tensor) -> Tensor:
        b, s, _ = x.shape
        ng, d = self.groups, self.spec.head_dim
        rep = self.spec.num_heads // self.spec.num_query_groups
        # megatron Attention.get_query_key_value_tensors: per group [q heads; k; v]
        qkv = self.linear_qkv(self.tp.copy_to(x))
        q, k, v = torch.split(qkv.view(b, s, ng, (rep + 2) * d), [rep * d, d, d], dim=-1)
        if self.spec.qk_layernorm:
            q, k = self.q_layernorm(q.reshape(b, s, ng * rep, d)), self.k_layernorm(k)
        q = _rotate(q.reshape(b, s, ng * rep, d), *rope).transpose(1, 2)
        k = _rotate(k, *rope).transpose(1, 2).repeat_interleave(rep, dim=1)
        v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / self.norm_factor)
        probs = torch.softmax(scores.masked_fill(~causal, MASK_VALUE), dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1)
        return self.tp.reduce_from(self.linear_proj(ctx))


class SwiGLUFunction(torch.autograd.Function):
    """megatron's fused SwiGLU (`megatron/core/fusions/fused_bias_swiglu.py`): the same forward, its input the only
    saved tensor, and the hand-written backward `swiglu_back` (other roundings than autograd's chain rule)."""

    @staticmethod
    def forward(ctx: Any, y: Tensor) -> Tensor:
        ctx.save_for_backward(y)
        y_1, y_2 = torch.chunk(y, 2, -1)
        return F.silu(y_1) * y_2

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        y_1, y_2 = torch.chunk(y, 2, -1)
        return torch.cat((g * torch.sigmoid(y_1) * (1 + y_1 * (1 - torch.sigmoid(y_1))) * y_2, g * F.silu(y_1)), -1)


class MLP(nn.Module):
    """SwiGLU with `linear_fc1 = [gate; up]` (megatron `mlp.py`: chunk, silu(gate) * up; `fused`: megatron's
    `bias_swiglu_impl`, the `SwiGLUFunction` above); under tensor parallelism each rank holds [its gate rows; its
    up rows] and the matching columns of `linear_fc2`."""

    def __init__(self, hidden: int, ffn: int, std: float, out_std: float, activation: str = "silu",
                 tp: TensorParallel = NO_TP, fused: bool = False) -> None:
        super().__init__()
        self.tp = tp
        self.linear_fc1 = Linear(2 * ffn // tp.size, hidden, std)
        self.linear_fc2 = Linear(hidden, ffn // tp.size, out_std)
        self.act = F.gelu if activation == "gelu" else F.silu  # gelu: an injected bug (twin.faults)
        self.fused = fused and activation == "silu"

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear_fc1(self.tp.copy_to(x))
        if self.fused:
            y: Tensor = SwiGLUFunction.apply(h)  # type: ignore[no-untyped-call]
        else:
            gate, up = torch.chunk(h, 2, dim=-1)
            y = self.act(gate) * up
        return self.tp.reduce_from(self.linear_fc2(y))


class SharedExperts(MLP):
    gate_weight: nn.Parameter

    def __init__(self, hidden: int, ffn: int, gate: bool, std: float, out_std: float, activation: str = "silu",
                 tp: TensorParallel = NO_TP, fused: bool = False) -> None:
        super().__init__(hidden, ffn, std, out_std, activation, tp, fused)
        self.use_gate = gate
        if gate:
            self.gate_weight = nn.Parameter(torch.empty(1, hidden))
            nn.init.normal_(self.gate_weight, 0.0, std)

    def forward(self, x: Tensor) -> Tensor:
        out = super().forward(x)
        if self.use_gate:
            out = out * torch.sigmoid(F.linear(x, self.gate_weight))
        return out


class Router(nn.Module):
    expert_bias: Tensor

    def __init__(self, hidden: int, moe: MoESpec, std: float) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden))
        nn.init.normal_(self.weight, 0.0, std)
        if moe.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(moe.num_experts, dtype=torch.float32))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Dense routing probabilities [T, E], routed-token counts [E], raw aux loss (before coefficient)."""
        m = self.moe
        logits = F.linear(x, self.weight)
        if m.score_function == "softmax":
            values, top = torch.topk(logits, m.topk, dim=1)
            probs = torch.softmax(values, dim=-1, dtype=torch.float32)
            aux_scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
            if not m.norm_topk_prob:  # an injected bug (twin.faults): the top-k of the full softmax
                probs = torch.gather(aux_scores, 1, top)
        else:
            scores = torch.sigmoid(logits)
            routing_scores = scores + self.expert_bias if m.expert_bias else scores
            _, top = torch.topk(routing_scores, m.topk, dim=1)
            picked = torch.gather(scores, 1, top)
            probs = picked / (picked.sum(dim=-1, keepdim=True) + 1e-20) if m.topk > 1 and m.norm_topk_prob else picked
            aux_scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
        if m.topk_scaling_factor:
            probs = probs * m.topk_scaling_factor
        if torch.are_deterministic_algorithms_enabled():  # as megatron's topk_routing_with_score_function
            rows = torch.arange(logits.shape[0], device=logits.device).unsqueeze(1)
            dense = torch.zeros_like(logits).index_put_((rows, top), probs)
            routed = torch.zeros_like(logits).index_put_((rows, top), torch.ones_like(probs))
        else:
            dense = torch.zeros_like(logits).scatter(1, top, probs)
            routed = torch.zeros_like(logits).scatter(1, top, 1.0)
        _, aux_top = torch.topk(aux_scores, m.topk, dim=1)
        aux_counts = torch.zeros_like(logits).scatter(1, aux_top, 1.0).sum(0)
        n = x.shape[0]
        aux = torch.sum(aux_scores.sum(0) * aux_counts) * (m.num_experts / (m.topk * n * n))
        return dense, routed.sum(0).detach(), aux


class Experts(nn.Module):
    """megatron `SequentialMLP`: one local-spec MLP per expert (`local_experts.{e}`)."""

    def __init__(self, hidden: int, moe: MoESpec, std: float, out_std: float, activation: str = "silu",
                 tp: TensorParallel = NO_TP, fused: bool = False) -> None:
        super().__init__()
        self.local_experts = nn.ModuleList(
            [MLP(hidden, moe.ffn_hidden_size, std, out_std, activation, tp, fused) for _ in range(moe.num_experts)]
        )

    def forward(self, x: Tensor, probs: Tensor) -> Tensor:
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.local_experts):  # expert-id order (docs/seeds.md#glm-52-conversion-rules)
            out = out + probs[:, e : e + 1] * expert(x)
        return out


class MoELayer(nn.Module):
    router: Router
    experts: Experts
    shared_experts: SharedExperts

    def __init__(self, hidden: int, moe: MoESpec, std: float, out_std: float, activation: str = "silu",
                 tp: TensorParallel = NO_TP, fused: bool = False) -> None:
        super().__init__()
        self.moe = moe
        self.router = Router(hidden, moe, std)
        self.experts = Experts(hidden, moe, std, out_std, activation, tp, fused)
        if moe.shared_ffn_hidden_size is not None:
            self.shared_experts = SharedExperts(hidden, moe.shared_ffn_hidden_size, moe.shared_expert_gate, std,
                                                out_std, activation, tp, fused)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs, counts, aux = self.router(flat)
        out = self.experts(flat, probs)
        if self.moe.shared_ffn_hidden_size is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape), aux, counts


class TransformerLayer(nn.Module):
    mlp: MoELayer | MLP

    def __init__(self, spec: TwinSpec, is_moe: bool, tp: TensorParallel = NO_TP) -> None:
        super().__init__()
        std, out_std = spec.init_std, spec.init_std / math.sqrt(2.0 * spec.num_layers)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.self_attention = SelfAttention(spec, out_std, tp)
        self.pre_mlp_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.is_moe = is_moe
        fused = spec.bias_swiglu_fusion
        if is_moe:
            assert spec.moe is not None
            self.mlp = MoELayer(spec.hidden_size, spec.moe, std, out_std, spec.activation, tp, fused)
        else:
            self.mlp = MLP(spec.hidden_size, spec.ffn_hidden_size, std, out_std, spec.activation, tp, fused)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], causal: Tensor, moe_out: list[tuple[Tensor, Tensor]]
                ) -> Tensor:
        h = x + self.self_attention(self.input_layernorm(x), rope, causal)
        if self.is_moe:
            out, aux, counts = self.mlp(self.pre_mlp_layernorm(h))
            moe_out.append((aux, counts))
            return cast(Tensor, h + out)
        return cast(Tensor, h + self.mlp(self.pre_mlp_layernorm(h)))


class Decoder(nn.Module):
    """The decoder layers of one pipeline stage (module-local numbering), the final norm on the last stage."""

    layers: nn.ModuleList

    def __init__(self, spec: TwinSpec, layers: range, *, last_stage: bool = True, tp: TensorParallel = NO_TP
                 ) -> None:
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(spec, spec.moe_layers[i], tp) for i in layers])
        if last_stage:
            self.final_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)


class MTPLayer(nn.Module):
    enorm: RMSNorm
    hnorm: RMSNorm
    eh_proj: Linear
    final_layernorm: RMSNorm

    def __init__(self, spec: TwinSpec, inner_name: str, tp: TensorParallel = NO_TP) -> None:
        super().__init__()
        h = spec.hidden_size
        self.tp = tp
        self.enorm = RMSNorm(h, spec.norm_eps)
        self.hnorm = RMSNorm(h, spec.norm_eps)
        self.eh_proj = Linear(h // tp.size, 2 * h, spec.init_std)  # column-parallel, then gathered
        self.inner_name = inner_name
        self.add_module(inner_name, TransformerLayer(spec, spec.mtp_inner_is_moe, tp))
        self.final_layernorm = RMSNorm(h, spec.norm_eps)

    @property
    def inner(self) -> TransformerLayer:
        layer: TransformerLayer = getattr(self, self.inner_name)
        return layer


class MTP(nn.Module):
    layers: nn.ModuleList

    def __init__(self, spec: TwinSpec, inner_name: str, tp: TensorParallel = NO_TP) -> None:
        super().__init__()
        self.layers = nn.ModuleList([MTPLayer(spec, inner_name, tp) for _ in range(spec.mtp_num_layers)])


def _shift_left(x: Tensor) -> Tensor:
    """megatron `roll_tensor(x, -1, -1)`: roll left, zero the last position."""
    rolled = torch.roll(x, shifts=-1, dims=-1)
    rolled[..., -1] = 0
    return rolled


class Outputs:
    """What one micro-batch forward returns (tensors; the trainer reduces them)."""

    __slots__ = ("aux_raw", "counts", "lm_sum", "mtp_means", "num_tokens", "objective")

    def __init__(self, objective: Tensor, lm_sum: Tensor, num_tokens: int, mtp_means: list[Tensor],
                 aux_raw: list[Tensor], counts: list[Tensor]) -> None:
        self.objective, self.lm_sum, self.num_tokens = objective, lm_sum, num_tokens
        self.mtp_means, self.aux_raw, self.counts = mtp_means, aux_raw, counts


class TwinGPTTorch(nn.Module):
    """The twin model with megatron-core `GPTModel` state-dict names (local spec): the whole model, or one
    (tensor-parallel rank, pipeline stage) of it (`alignflow.twin.torch_parallel`)."""

    mtp: MTP
    embedding: Embedding
    output_layer: Linear

    def __init__(self, spec: TwinSpec, *, mtp_inner_name: str = "transformer_layer", tp: TensorParallel = NO_TP,
                 stage: int = 0, stages: int = 1) -> None:
        super().__init__()
        self.spec, self.tp = spec, tp
        assert spec.num_layers % stages == 0, f"{spec.num_layers} layers do not split into {stages} stages"
        per = spec.num_layers // stages
        self.first_stage, self.last_stage = stage == 0, stage == stages - 1
        self.layer_offset = stage * per
        mtp_here = self.last_stage and spec.mtp_num_layers > 0
        if self.first_stage or mtp_here:  # megatron GPTModel: `if self.pre_process or self.mtp_process`
            self.embedding = Embedding(spec.vocab_size, spec.hidden_size, spec.init_std, tp)
        self.decoder = Decoder(spec, range(self.layer_offset, self.layer_offset + per), last_stage=self.last_stage,
                               tp=tp)
        if self.last_stage:
            self.output_layer = Linear(spec.vocab_size // tp.size, spec.hidden_size, spec.init_std)
        if mtp_here:
            self.mtp = MTP(spec, mtp_inner_name, tp)
        self.aux_coeff = spec.moe.aux_loss_coeff if spec.moe is not None else 0.0

    def moe_layers(self) -> list[MoELayer]:
        """This stage's MoE layers in the order the forward reports them (decoder, then MTP inner layers)."""
        return [layer.mlp for layer in self._layers() if isinstance(layer.mlp, MoELayer)]

    def moe_positions(self) -> list[int]:
        """Where this stage's MoE layers are among the whole model's (decoder, then MTP): for summing the logged
        values of all stages."""
        spec = self.spec
        everything = [i for i in range(spec.num_layers) if spec.moe_layers[i]]
        everything += [spec.num_layers + k for k in range(spec.mtp_num_layers) if spec.mtp_inner_is_moe]
        mine = [self.layer_offset + i for i, layer in enumerate(self.decoder.layers)
                if isinstance(cast(TransformerLayer, layer).mlp, MoELayer)]
        if self.last_stage and spec.mtp_inner_is_moe:
            mine += [spec.num_layers + k for k in range(spec.mtp_num_layers)]
        return [everything.index(i) for i in mine]

    def _layers(self) -> list[TransformerLayer]:
        layers = [cast(TransformerLayer, layer) for layer in self.decoder.layers]
        if self.last_stage and self.spec.mtp_num_layers:
            layers += [cast(MTPLayer, m).inner for m in self.mtp.layers]
        return layers

    @torch.no_grad()
    def update_expert_bias(self, counts: list[Tensor]) -> None:
        """Megatron `get_updated_expert_bias`: bias += sign(mean(count) - count) * rate, once per step."""
        for layer, c in zip(self.moe_layers(), counts, strict=True):
            if layer.moe.expert_bias:
                offset = c.sum(dim=-1, keepdim=True) / c.shape[-1] - c
                layer.router.expert_bias += torch.sign(offset) * layer.moe.bias_update_rate

    def _decoder(self, x: Tensor, rope: tuple[Tensor, Tensor], causal: Tensor,
                 moe_out: list[tuple[Tensor, Tensor]]) -> Tensor:
        """The decoder layers; with recomputation (megatron `--recompute-granularity full --recompute-method
        uniform --recompute-num-layers N`) each chunk of N layers keeps only its input and is run again in the
        backward pass (`torch.utils.checkpoint`, non-reentrant: what megatron's `CheckpointFunction` does)."""
        layers = list(self.decoder.layers)
        chunk = self.spec.recompute_num_layers
        if chunk <= 0 or not torch.is_grad_enabled():
            for layer in layers:
                x = layer(x, rope, causal, moe_out)
            return x
        from torch.utils.checkpoint import checkpoint

        for start in range(0, len(layers), chunk):
            def run(h: Tensor, part: list[nn.Module] = layers[start:start + chunk]) -> Tensor:
                for layer in part:
                    h = layer(h, rope, causal, moe_out)
                return h

            x = cast(Tensor, checkpoint(run, x, use_reentrant=False))
        # the recomputation in the backward pass appends to `moe_out` again; `head` and `run_micro_batch` read the
        # forward's own entries (the first ones, in layer order) before the backward
        return x

    def _context(self, tokens: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
        s = tokens.shape[1]
        return rope_tables(self.spec, tokens.device), torch.ones(s, s, dtype=torch.bool, device=tokens.device).tril()

    def stage_forward(self, tokens: Tensor, hidden: Tensor | None, moe_out: list[tuple[Tensor, Tensor]]) -> Tensor:
        """This stage's decoder layers: from the tokens (first stage) or the previous stage's hidden states."""
        rope, causal = self._context(tokens)
        x = self.embedding(tokens) if self.first_stage else hidden
        assert x is not None
        return self._decoder(x, rope, causal, moe_out)

    def _logits(self, hidden: Tensor) -> Tensor:
        return self.tp.gather_from(self.output_layer(self.tp.copy_to(hidden)))

    def head(self, x: Tensor, tokens: Tensor, labels: Tensor, micro_scale: float,
             moe_out: list[tuple[Tensor, Tensor]]) -> Outputs:
        """The last stage after its decoder layers: final norm, LM loss, MTP, this stage's aux losses."""
        spec = self.spec
        rope, causal = self._context(tokens)
        hidden = self.decoder.final_layernorm(x)
        lm = F.cross_entropy(self._logits(hidden).flatten(0, 1), labels.flatten(), reduction="none")
        lm_sum = lm.sum()
        objective = lm_sum / labels.numel()
        mtp_means: list[Tensor] = []
        ids, mtp_labels = tokens, labels
        mask = torch.ones_like(labels, dtype=torch.float32)
        for k in range(spec.mtp_num_layers):
            layer = cast(MTPLayer, self.mtp.layers[k])
            ids, mtp_labels, mask = _shift_left(ids), _shift_left(mtp_labels), _shift_left(mask)
            emb = self.embedding(ids)
            cat = torch.cat((layer.enorm(emb), layer.hnorm(hidden)), dim=-1)
            h = self.tp.gather_from(layer.eh_proj(self.tp.copy_to(cat)))
            hidden = layer.final_layernorm(layer.inner(h, rope, causal, moe_out))
            ce = F.cross_entropy(self._logits(hidden).flatten(0, 1), mtp_labels.flatten(), reduction="none")
            mtp_means.append((ce * mask.flatten()).sum() / mask.sum())
            objective = objective + spec.mtp_loss_scaling_factor / spec.mtp_num_layers * mtp_means[-1]
        aux_raw = [aux for aux, _ in moe_out]
        if aux_raw and self.aux_coeff:
            objective = objective + self.aux_coeff * torch.stack(aux_raw).sum()
        return Outputs(objective * micro_scale, lm_sum.detach(), labels.numel(),
                       [m.detach() for m in mtp_means], [a.detach() for a in aux_raw], [c for _, c in moe_out])

    def aux_objective(self, moe_out: list[tuple[Tensor, Tensor]], micro_scale: float) -> Tensor | None:
        """A stage before the last: its MoE layers' aux loss term of the objective (the rest is downstream)."""
        aux_raw = [aux for aux, _ in moe_out]
        if not aux_raw or not self.aux_coeff:
            return None
        return self.aux_coeff * torch.stack(aux_raw).sum() * micro_scale

    def forward(self, tokens: Tensor, labels: Tensor, micro_scale: float = 1.0) -> Outputs:
        """The whole model in one stage (no pipeline)."""
        assert self.first_stage, "a pipeline stage runs stage_forward / head"
        assert self.last_stage, "a pipeline stage runs stage_forward / head"
        moe_out: list[tuple[Tensor, Tensor]] = []
        return self.head(self.stage_forward(tokens, None, moe_out), tokens, labels, micro_scale, moe_out)
