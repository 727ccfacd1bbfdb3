"""The PyTorch twin is megatron-core's GPTModel: same state-dict names and shapes, same losses and gradients.

megatron-core 0.16.1 (the pinned test dependency) builds the local-spec `GPTModel` on the CPU here. Its MoE
and attention code has a few CUDA-only lines that a CPU build of torch cannot run, so the test patches exactly
those, none of which touches the numbers: `torch.cuda.current_device()` (where router buffers are placed) returns
"cpu", the CUDA RNG tracker's `fork()` is a no-op (dropout is 0), `te_general_gemm` is set to None (0.16.1
references it unguarded when Transformer Engine is absent), the causal mask is passed explicitly, and the MoE
dispatcher is `allgather` (alltoall creates a CUDA stream; both compute the same result at EP=1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # builds real megatron-core GPTModels on the CPU

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytest.importorskip("megatron.core")

from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import (  # noqa: E402
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_mtp_block_spec,
)
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.transformer.moe import moe_utils  # noqa: E402
from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker  # noqa: E402
from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from alignflow.twin.presets import preset, twin_spec  # noqa: E402
from alignflow.twin.torch_model import TwinGPTTorch  # noqa: E402


@pytest.fixture(scope="module")
def megatron_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("mcore") / "store"
    created = not torch.distributed.is_initialized()
    if created:
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "current_device", lambda: "cpu")
        mp.setattr(tensor_parallel.get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
        mp.setattr(moe_utils, "te_general_gemm", None, raising=False)
        yield
    parallel_state.destroy_model_parallel()
    if created:
        torch.distributed.destroy_process_group()


def _megatron_model(name: str) -> Any:
    model = preset(name)
    moe = model.moe
    cfg = TransformerConfig(
        num_layers=model.num_layers, hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
        num_query_groups=model.query_groups, kv_channels=model.head_dim, ffn_hidden_size=model.ffn_hidden_size,
        gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm", layernorm_epsilon=model.norm_epsilon,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False,
        bias_dropout_fusion=False, bias_activation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=True, qk_layernorm=model.qk_layernorm,
        num_moe_experts=moe.num_experts if moe else None, moe_router_topk=moe.router_topk if moe else 2,
        moe_ffn_hidden_size=moe.ffn_hidden_size if moe else None,
        moe_shared_expert_intermediate_size=moe.shared_expert_intermediate_size if moe else None,
        moe_shared_expert_gate=bool(moe and moe.shared_expert_gate),
        moe_layer_freq=list(moe.layer_freq) if moe and moe.layer_freq else 1,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=moe.aux_loss_coeff if moe else 0.0,
        moe_router_score_function=moe.router_score_function if moe else "softmax",
        moe_router_enable_expert_bias=bool(moe and moe.router_enable_expert_bias),
        moe_token_dispatcher_type="allgather",
        mtp_num_layers=model.mtp.num_layers if model.mtp else None,
        mtp_loss_scaling_factor=model.mtp.loss_scaling_factor if model.mtp else 0.1)
    layer_spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    mtp_spec = get_gpt_mtp_block_spec(cfg, get_gpt_decoder_layer_specs(cfg, False, "RMSNorm")[-1],
                                      use_transformer_engine=False)
    return GPTModel(config=cfg, transformer_layer_spec=layer_spec, vocab_size=model.vocab_size,
                    max_sequence_length=model.seq_length, share_embeddings_and_output_weights=False,
                    position_embedding_type="rope", rotary_base=int(model.rotary_base), mtp_block_spec=mtp_spec)


def _shapes(sd: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v.shape) if hasattr(v, "shape") else v for k, v in sd.items()}


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("name", ["twin-moe", "twin-moe-bias", "twin-dense", "qwen3"])
def test_state_dict_names_and_shapes_are_megatron_core_s(name: str) -> None:
    reference = _megatron_model(name).state_dict()
    twin = TwinGPTTorch(twin_spec(preset(name))).state_dict()
    assert _shapes(twin) == _shapes(reference)  # incl. `_extra_state: None` of every local linear


@pytest.mark.usefixtures("megatron_world")
@pytest.mark.parametrize("name", ["twin-moe", "twin-moe-bias"])
def test_forward_and_gradients_agree(name: str) -> None:
    torch.manual_seed(0)
    twin = TwinGPTTorch(twin_spec(preset(name)))
    reference = _megatron_model(name)
    reference.load_state_dict(twin.state_dict(), strict=True)
    reference.train()
    tokens = torch.randint(0, 256, (2, 33))
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(32).unsqueeze(0).expand(2, -1)
    causal = torch.triu(torch.ones(32, 32), diagonal=1).bool()[None, None]
    per_token = reference(ids, positions, causal, labels=labels, loss_mask=torch.ones(2, 32))
    lm = per_token.float().mean()
    out = twin(ids, labels)
    # the same operations in the same order: equal up to fp32 rounding of a differently blocked matmul
    # ([s, b, h] there, [b, s, h] here); usually bit-identical
    same = {"rtol": 1e-6, "atol": 0.0}
    torch.testing.assert_close(out.lm_sum / out.num_tokens, lm.detach(), **same)
    torch.testing.assert_close(torch.stack(out.mtp_means), MTPLossLoggingHelper.tracker["values"], **same)
    aux = get_moe_layer_wise_logging_tracker()["load_balancing_loss"]["values"]
    torch.testing.assert_close(torch.stack(out.aux_raw), aux[1:], **same)  # layer 0 is dense
    # Megatron's backward adds the aux and MTP gradients through its autoscalers; the twin differentiates
    # lm + coeff * aux + scale * mtp directly: the same gradient up to summation order.
    lm.backward()
    out.objective.backward()
    reference_grads = dict(reference.named_parameters())
    for param_name, param in twin.named_parameters():
        theirs = reference_grads[param_name].grad
        assert theirs is not None, param_name
        torch.testing.assert_close(param.grad, theirs, rtol=1e-5, atol=1e-7, msg=param_name)
    moe_utils.clear_aux_losses_tracker()
    MTPLossLoggingHelper.clean_loss_in_tracker()


def test_module_docstring_names_every_patch() -> None:
    text = Path(__file__).read_text()
    for patched in ("current_device", "fork", "te_general_gemm", "allgather"):
        assert patched in text.split('"""')[1]


@pytest.mark.usefixtures("megatron_world")
def test_qk_layernorm_forward_and_gradients_agree() -> None:
    """qwen3: q/k RMSNorm over head_dim before RoPE, as megatron-core's `--qk-layernorm` local spec does it."""
    torch.manual_seed(0)
    twin = TwinGPTTorch(twin_spec(preset("qwen3")))
    with torch.no_grad():  # gamma != 1, or a missing q/k norm would not change the numbers
        for name, param in twin.named_parameters():
            if name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
                param.uniform_(0.5, 1.5)
    reference = _megatron_model("qwen3")
    reference.load_state_dict(twin.state_dict(), strict=True)
    tokens = torch.randint(0, 256, (2, 33))
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(32).unsqueeze(0).expand(2, -1)
    causal = torch.triu(torch.ones(32, 32), diagonal=1).bool()[None, None]
    lm = reference(ids, positions, causal, labels=labels, loss_mask=torch.ones(2, 32)).float().mean()
    out = twin(ids, labels)
    torch.testing.assert_close(out.lm_sum / out.num_tokens, lm.detach(), rtol=1e-6, atol=0.0)
    lm.backward()
    out.objective.backward()
    reference_grads = dict(reference.named_parameters())
    for param_name, param in twin.named_parameters():
        torch.testing.assert_close(param.grad, reference_grads[param_name].grad, rtol=1e-5, atol=1e-7,
                                   msg=param_name)
