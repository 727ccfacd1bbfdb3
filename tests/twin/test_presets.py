from __future__ import annotations

import pytest

from alignflow.config.model import MLAConfig
from alignflow.errors import ConfigError
from alignflow.twin.presets import PRESETS, preset, twin_spec


def test_default_preset_is_the_issue_model() -> None:
    spec = twin_spec(preset())
    assert (spec.vocab_size, spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_query_groups,
            spec.head_dim, spec.seq_length, spec.ffn_hidden_size) == (256, 128, 4, 4, 2, 32, 32, 256)
    assert spec.moe_layers == (False, True, True, True)
    assert spec.moe is not None
    assert (spec.moe.num_experts, spec.moe.topk, spec.moe.ffn_hidden_size, spec.moe.shared_ffn_hidden_size) == (
        4, 2, 64, 64)
    assert spec.moe.shared_expert_gate
    assert spec.moe.score_function == "softmax"
    assert not spec.moe.expert_bias
    assert spec.mtp_num_layers == 1
    assert spec.mtp_inner_is_moe
    assert spec.qkv_rows == 256
    # Megatron divides the logged aux loss by decoder MoE layers + MTP layers
    assert spec.num_moe_layers_for_logging == 4


def test_bias_and_dense_presets() -> None:
    bias = twin_spec(preset("twin-moe-bias"))
    assert bias.moe is not None
    assert bias.moe.score_function == "sigmoid"
    assert bias.moe.expert_bias
    dense = twin_spec(preset("twin-dense"))
    assert dense.moe is None
    assert not any(dense.moe_layers)
    assert not dense.mtp_inner_is_moe
    assert set(PRESETS) == {"twin-moe", "twin-moe-bias", "twin-dense", "qwen3"}


@pytest.mark.integration
def test_presets_are_the_twin_conversion_specs_models() -> None:
    import subprocess
    import sys

    from alignflow.convert import load_spec

    for name in PRESETS:
        assert preset(name) == load_spec(name).model
        assert preset(name).family == name
    # the MindSpore twin imports this module (twin_spec) without torch; only preset() loads the spec
    code = "import sys, alignflow.twin.presets; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(ConfigError, match="twin-moe, twin-moe-bias, twin-dense"):
        preset("twin-huge")


@pytest.mark.parametrize(("update", "field"), [
    ({"mla": MLAConfig(kv_lora_rank=8, qk_head_dim=8, qk_pos_emb_head_dim=8, v_head_dim=8)}, "model.mla"),
    ({"add_bias_linear": True}, "model.add_bias_linear"),
    ({"attention_output_gate": True}, "model.attention_output_gate"),
    ({"normalization": "LayerNorm"}, "model.normalization"),
    ({"rotary_percent": 0.5}, "model.rotary_percent"),
    ({"hidden_dropout": 0.1}, "model.hidden_dropout"),
    ({"untie_embeddings_and_output_weights": False}, "model.untie_embeddings_and_output_weights"),
])
def test_unsupported_features_are_rejected_by_field(update: dict[str, object], field: str) -> None:
    model = preset().model_copy(update=update)
    with pytest.raises(ConfigError) as err:
        twin_spec(model)
    assert field in str(err.value)


def test_every_problem_is_listed_at_once() -> None:
    model = preset().model_copy(update={"add_bias_linear": True, "attention_output_gate": True})
    with pytest.raises(ConfigError) as err:
        twin_spec(model)
    assert len(err.value.problems) == 2
