# alignflow fix "mtp-experimental-attention" for Megatron-LM core_v0.19 (written for alignflow; no Megatron code in it).
#
# What it changes: from core_v0.19.0, pretrain_gpt.py builds the model through megatron/training/models/gpt.py, whose
# `mtp_block_spec` takes the MTP block's inner layer from `get_gpt_decoder_layer_specs`. That function asserts on any
# experimental attention variant (megatron/core/models/gpt/gpt_layer_specs.py:572 in core_v0.19.0: "Experimental
# attention variant is not supported with get_gpt_decoder_layer_specs"), so no MTP model with DSA or GatedDeltaNet
# builds. core_v0.19.0's own gpt_builders.py takes the MTP layer from the variant's layer specs
# (`get_transformer_layer_with_experimental_attention_variant_spec`), the last decoder layer's spec; this fix makes the
# ModelBuilder path do the same, and changes nothing else (no variant, or no MTP: the release's own function runs).
#
# How it is applied: the step's launcher (megatron_launch.py, written by alignflow into the step directory) runs this
# file before pretrain_gpt.py; the run records its sha256 with the step's code version.
from typing import Any

import megatron.training.models.gpt as _builder

_release_mtp_block_spec: Any = _builder.mtp_block_spec


def _mtp_block_spec_from_variant_layers(config: Any, transformer_layer_spec: Any, vp_stage: int | None = None) -> Any:
    transformer = config.transformer
    empty_stage = hasattr(transformer_layer_spec, "layer_specs") and len(transformer_layer_spec.layer_specs) == 0
    if transformer.mtp_num_layers is None or transformer.experimental_attention_variant is None or empty_stage:
        return _release_mtp_block_spec(config, transformer_layer_spec, vp_stage=vp_stage)
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_transformer_layer_with_experimental_attention_variant_spec as variant_layer_specs,
    )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    last_layer = variant_layer_specs(config=transformer)[-1]
    use_te = transformer.transformer_impl == "transformer_engine"
    return get_gpt_mtp_block_spec(transformer, last_layer, use_transformer_engine=use_te, vp_stage=vp_stage)


_builder.mtp_block_spec = _mtp_block_spec_from_variant_layers
