"""Megatron state-dict naming flavours: local spec vs Transformer Engine, and the MTP inner-layer name.

The PyTorch twin is built with the local-spec module tree; a checkpoint in the Transformer-Engine flavour is a
renaming of it (docs/megatron.md#transformer-engine-names): the input norm fuses into `linear_qkv.layer_norm_weight`, a
dense layer's
pre-MLP norm into `mlp.linear_fc1.layer_norm_weight` (MoE layers keep `pre_mlp_layernorm`), grouped experts
become `mlp.experts.linear_fc{1,2}.weight{e}`, and every TE module carries an `_extra_state` that a strict load
requires, its norms (TENorm: final, MoE pre-MLP, MTP) included (`None` is a valid placeholder,
docs/megatron.md#where-_extra_state-keys-come-from). Local linears have an
optional `_extra_state` (their load hook
fills it). The MTP inner layer is `transformer_layer` up to megatron-core 0.16 and `mtp_model_layer` from 0.17.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from alignflow.convert.layout import mtp_inner_layer
from alignflow.convert.layout import parse_version as parse_version
from alignflow.errors import ConfigError

Flavour = Literal["local", "transformer_engine"]
FLAVOURS: tuple[str, ...] = ("local", "transformer_engine")


# One parser of megatron-core versions for the converter, the twin and preflight (torch-free).
mtp_inner_name = mtp_inner_layer  # name of the MTP inner transformer layer in that megatron-core version


def timestamp_has_microseconds(megatron_version: str) -> bool:
    """`training_log` prints `%H:%M:%S.%f` since megatron-core 0.16, `%H:%M:%S` before
    (docs/megatron.md#the-training_log-line)."""
    return parse_version(megatron_version) >= (0, 16)


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """How a model's local parameter names appear in a checkpoint of one flavour."""

    to_checkpoint: dict[str, str]  # model (local) name -> checkpoint name
    required_extra: frozenset[str]  # `_extra_state` keys a strict load needs
    optional_extra: frozenset[str]  # `_extra_state` keys accepted when present

    @property
    def from_checkpoint(self) -> dict[str, str]:
        return {ckpt: local for local, ckpt in self.to_checkpoint.items()}

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(self.to_checkpoint.values()) | self.required_extra | self.optional_extra


_LAYER = re.compile(r"^(decoder\.layers\.\d+|mtp\.layers\.\d+\.[a-z_]+)\.")
_TE_NORM = re.compile(r"^(decoder\.final_layernorm|mtp\.layers\.\d+\.(enorm|hnorm|final_layernorm))\.weight$")
_LOCAL_EXPERT = re.compile(r"^(?P<p>.+)\.mlp\.experts\.local_experts\.(?P<e>\d+)\.linear_fc(?P<n>[12])\.weight$")


def _layer_prefixes(names: Iterable[str]) -> list[str]:
    found: dict[str, None] = {}
    for name in names:
        match = _LAYER.match(name)
        if match and ".self_attention." in name:
            found[match.group(1)] = None
    return list(found)


def megatron_layout(model_names: Iterable[str], flavour: Flavour, *, grouped_gemm: bool = True) -> KeyLayout:
    """The checkpoint naming of `model_names` (parameters and persistent buffers, local-spec names)."""
    names = [n for n in model_names if not n.endswith("._extra_state")]
    present = set(names)
    linears = sorted(n[: -len(".weight")] for n in names if _is_linear(n))
    if flavour == "local":
        return KeyLayout({n: n for n in names}, frozenset(), frozenset(f"{m}._extra_state" for m in linears))
    if flavour != "transformer_engine":
        raise ConfigError(f"--transformer-impl {flavour!r}: expected one of {', '.join(FLAVOURS)}")
    to_ckpt = {n: n for n in names}
    required: set[str] = set()
    for p in _layer_prefixes(names):
        to_ckpt[f"{p}.input_layernorm.weight"] = f"{p}.self_attention.linear_qkv.layer_norm_weight"
        required |= {f"{p}.self_attention.linear_qkv._extra_state", f"{p}.self_attention.linear_proj._extra_state",
                     f"{p}.self_attention.core_attention._extra_state"}
        if f"{p}.mlp.linear_fc1.weight" in present:  # dense: the pre-MLP norm fuses into fc1
            to_ckpt[f"{p}.pre_mlp_layernorm.weight"] = f"{p}.mlp.linear_fc1.layer_norm_weight"
            required |= {f"{p}.mlp.linear_fc1._extra_state", f"{p}.mlp.linear_fc2._extra_state"}
        elif f"{p}.pre_mlp_layernorm.weight" in present:  # MoE: a TENorm of its own
            required.add(f"{p}.pre_mlp_layernorm._extra_state")
        if f"{p}.mlp.shared_experts.linear_fc1.weight" in present:
            required |= {f"{p}.mlp.shared_experts.linear_fc1._extra_state",
                         f"{p}.mlp.shared_experts.linear_fc2._extra_state"}
    # every other norm is a TENorm, whose `_extra_state` a strict load requires as well (TE 2.x: tests/data/keysets/)
    required |= {f"{n[: -len('.weight')]}._extra_state" for n in names if _TE_NORM.match(n)}
    for name in names:
        match = _LOCAL_EXPERT.match(name)
        if match is None:
            continue
        p, e, n = match.group("p"), match.group("e"), match.group("n")
        if grouped_gemm:  # TEGroupedMLP: one GroupedLinear per fc, weight{e}
            to_ckpt[name] = f"{p}.mlp.experts.linear_fc{n}.weight{e}"
            required.add(f"{p}.mlp.experts.linear_fc{n}._extra_state")
        else:  # SequentialMLP of TE linears
            required.add(f"{p}.mlp.experts.local_experts.{e}.linear_fc{n}._extra_state")
    # output_layer is a local ColumnParallelLinear even in the TE spec (its hook fills _extra_state); eh_proj's
    # is accepted, not required, as the conversion contract does not write it.
    optional = {"output_layer._extra_state"} | {f"{m}._extra_state" for m in linears if m.endswith(".eh_proj")}
    return KeyLayout(to_ckpt, frozenset(required), frozenset(optional - required))


def _is_linear(name: str) -> bool:
    """Weights of the local linears (which carry `_extra_state`): everything 2-D but embeddings/router/gates."""
    if not name.endswith(".weight"):
        return False
    return any(name.endswith(s) for s in (
        "linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight", "linear_fc2.weight", "eh_proj.weight",
    )) or name == "output_layer.weight"
