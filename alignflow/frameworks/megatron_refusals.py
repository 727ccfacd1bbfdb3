"""What megatron-core refuses after `pretrain_gpt.py`'s parser accepted every flag: a table, one row per refusal.

Each row was found by walking the shipped experiments through the real config classes, layer specs and model
constructors of every checked release (`megatron_build`; `tests/recipes/test_megatron_core.py` walks them again and
checks, for each row, that the real code raises the row's error at the row's source line). A row says what the
command line asks for, the level where Megatron stops, Megatron's own message, what to change, and the source line
per megatron-core series (`megatron/...:LINE` in the release's tree; the same lines on GitHub at the tag). Preflight
(`alignflow.preflight.megatron_combos`) and the converter's flavour check (`alignflow.convert.plan`) read this table;
the backends' flag generation keeps clear of it (`megatron_versions.kernel_flags`).

The settled arguments a row reads are `megatron_config.settle(parse_args(argv))`: Megatron's own names and defaults
(`apply_rope_fusion` is True unless `--no-rope-fusion`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Args = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Refusal:
    """One combination megatron-core refuses."""

    key: str
    what: str  # what the command line asks for, in words
    applies: Callable[[Args], bool]
    level: str  # megatron_build's level that stops: config, spec or model; forward: the first step, on the GPU
    error: str  # Megatron's exception, as it prints it (ending in "…": its fixed beginning)
    fix: str
    source: Mapping[str, str]  # megatron-core series where it refuses -> megatron/...:LINE

    def raised(self, error: str) -> bool:
        """Whether `error` (as Megatron printed it) is this row's."""
        return error == self.error or (self.error.endswith("…") and error.startswith(self.error[:-1]))

    def line(self, series: str) -> str:
        return (f"{self.what}: megatron-core {series} refuses it at {self.level} level ({self.error}; "
                f"{self.source[series]}); {self.fix}")


# alignflow's declared fix (alignflow.frameworks.megatron_fixes) that lets 0.19's ModelBuilder build MTP with a variant;
# preflight passes a side's declared fixes in the settled arguments under this key.
MTP_VARIANT_FIX = "mtp-experimental-attention"
FIXES_ARG = "alignflow_fixes"


def _mtp_variant(args: Args) -> bool:
    return _variant(args) is not None and args.get("mtp_num_layers") is not None


def _variant(args: Args) -> Any:
    return args.get("experimental_attention_variant")


def _te(args: Args) -> bool:
    return args.get("transformer_impl") == "transformer_engine"


REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        key="dsa-rope-fusion",
        what="DSA (--experimental-attention-variant dsa) with RoPE fusion (on unless --no-rope-fusion)",
        applies=lambda a: _variant(a) == "dsa" and bool(a.get("apply_rope_fusion")),
        level="config",
        error="AssertionError: RoPE fusion is not supported for DSAttention",
        fix="give --no-rope-fusion (alignflow renders it for DSA on every implementation)",
        source={"0.16": "megatron/core/transformer/transformer_config.py:1991",
                "0.17": "megatron/core/transformer/transformer_config.py:2233",
                "0.18": "megatron/core/transformer/transformer_config.py:2546",
                "0.19": "megatron/core/transformer/transformer_config.py:2838"},
    ),
    Refusal(
        key="dsa-linear-bias",
        what="DSA (--experimental-attention-variant dsa) with linear biases (--disable-bias-linear absent)",
        applies=lambda a: _variant(a) == "dsa" and bool(a.get("add_bias_linear", True)),
        level="config",
        error="ValueError: DSA uses AbsorbedMLASelfAttention, which requires add_bias_linear=False. Disable linear "
              "bias for DSA configs.",
        fix="give --disable-bias-linear (model.add_bias_linear: false)",
        source={"0.19": "megatron/core/transformer/transformer_config.py:1386"},
    ),
    Refusal(
        key="dsa-needs-0.18",
        what="DSA (--experimental-attention-variant dsa) on megatron-core before 0.18",
        applies=lambda a: _variant(a) == "dsa" and _te(a),
        level="spec",
        error="ValueError: Invalid experimental attention variant: dsa",
        fix="use megatron-core 0.18 or 0.19 (gpu.megatron_version): 0.16 and 0.17 accept the flag and the config, but "
            "their experimental block spec builds only gated_delta_net",
        source={"0.16": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:142",
                "0.17": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:142"},
    ),
    Refusal(
        key="dsa-without-mla",
        what="DSA (--experimental-attention-variant dsa) without --multi-latent-attention",
        applies=lambda a: _variant(a) == "dsa" and _te(a) and not a.get("multi_latent_attention"),
        level="spec",
        error="AssertionError: Currently only MLA supports sparse attention.",
        fix="DSA needs MLA (model.mla)",
        source={"0.18": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:83",
                "0.19": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:85"},
    ),
    Refusal(
        key="variant-needs-te",
        what="an experimental attention variant (--experimental-attention-variant: DSA, GatedDeltaNet) without "
             "Transformer Engine's implementation",
        applies=lambda a: _variant(a) is not None and not _te(a),
        level="spec",
        error="AssertionError: Experimental GPT decoder block spec only supports transformer engine implementation "
              "for now.",
        fix="use --transformer-impl transformer_engine (gpu.transformer_impl) on a host with Transformer Engine",
        source={"0.16": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:356",
                "0.17": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:356",
                "0.18": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:370",
                "0.19": "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:442"},
    ),
    Refusal(
        key="mla-needs-te",
        what="MLA (--multi-latent-attention) with the local implementation",
        applies=lambda a: bool(a.get("multi_latent_attention")) and a.get("transformer_impl") == "local",
        level="model",
        error="TypeError: DotProductAttention.__init__() got an unexpected keyword argument 'k_channels'",
        fix="use --transformer-impl transformer_engine (gpu.transformer_impl) on a host with Transformer Engine: the "
            "local DotProductAttention has no k_channels, which MLASelfAttention passes it",
        source={"0.16": "megatron/core/transformer/multi_latent_attention.py:162",
                "0.17": "megatron/core/transformer/multi_latent_attention.py:177",
                "0.18": "megatron/core/transformer/multi_latent_attention.py:214",
                "0.19": "megatron/core/transformer/multi_latent_attention.py:214"},
    ),
)


REFUSALS += (
    Refusal(
        key="mtp-variant-builder",
        what="MTP (--mtp-num-layers) with an experimental attention variant (DSA, GatedDeltaNet), built by "
             "pretrain_gpt.py's ModelBuilder (megatron/training/models/gpt.py:409 mtp_block_spec)",
        applies=lambda a: _mtp_variant(a) and MTP_VARIANT_FIX not in a.get(FIXES_ARG, ()),
        level="spec",
        error="AssertionError: Experimental attention variant is not supported with get_gpt_decoder_layer_specs, "
              "but got config.experimental_attention_variant=…",
        fix=f"declare the fix `{MTP_VARIANT_FIX}` (gpu.fixes: the MTP layer takes the variant's layer spec, as "
            "gpt_builders.py does; docs/recipes/glm52.md), or train without MTP",
        source={"0.19": "megatron/core/models/gpt/gpt_layer_specs.py:572"},
    ),
    Refusal(
        key="mtp-dsa-plain-mla",
        what="MTP (--mtp-num-layers) with DSA (--experimental-attention-variant dsa) on megatron-core 0.18, whose "
             "gpt_builders.py gives the MTP layer the plain MLA layer spec while MLA passes DSA's arguments to it",
        applies=lambda a: _variant(a) == "dsa" and a.get("mtp_num_layers") is not None and _te(a),
        level="forward",
        error="TypeError: TEDotProductAttention.forward() got an unexpected keyword argument 'x'",
        fix="use megatron-core 0.19 with the declared fix `mtp-experimental-attention` (gpu.fixes), or train without "
            "MTP (seen on an H100 with TE 2.17.1, issue 50)",
        source={"0.18": "megatron/core/transformer/multi_latent_attention.py:283"},
    ),
    Refusal(
        key="dsa-indexer-loss-coeff-unset",
        what="DSA (--experimental-attention-variant dsa) without --dsa-indexer-loss-coeff",
        applies=lambda a: _variant(a) == "dsa" and a.get("dsa_indexer_loss_coeff") is None,
        level="forward",
        error="TypeError: unsupported operand type(s) for *: 'Tensor' and 'NoneType'",
        fix="give --dsa-indexer-loss-coeff (model.dsa.indexer_loss_coeff: alignflow renders it; 0.18 multiplies the "
            "indexer loss by the unset None; seen on an H100, issue 50)",
        source={"0.18": "megatron/core/transformer/experimental_attention_variant/dsa.py:250"},
    ),
)


def refusals(args: Args, series: str) -> list[Refusal]:
    """The rows that refuse these settled arguments on megatron-core `series` (`0.19`), in table order."""
    return [r for r in REFUSALS if series in r.source and r.applies(args)]


def te_requirements(args: Args, series: str) -> list[Refusal]:
    """What in these arguments the local implementation of `series` refuses, i.e. what needs Transformer Engine."""
    local = {**args, "transformer_impl": "local"}
    return [r for r in refusals(local, series) if r.key in ("variant-needs-te", "mla-needs-te")]


_VARIANTS = {"dsa": "DSA", "gated_delta_net": "GatedDeltaNet"}


def needs_te_what(row: Refusal, args: Args) -> str:
    """The feature a TE-requirement row is about, for these arguments: `DSA (--experimental-attention-variant dsa)`."""
    if row.key == "variant-needs-te":
        variant = _variant(args)
        return f"{_VARIANTS.get(variant, variant)} (--experimental-attention-variant {variant})"
    return "MLA (--multi-latent-attention)"


def model_te_requirements(*, mla: bool, variant: str | None, series: str) -> list[Refusal]:
    """`te_requirements` of a model with MLA or not and an attention variant (for the converter's flavours)."""
    return te_requirements({"multi_latent_attention": mla, "experimental_attention_variant": variant}, series)
