"""megatron-core's own model classes, built for checkpoint work: a `GPTModel` of an experiment's model section at a
given TP / PP / EP, on the CPU or on the `meta` device, and the process-group worlds it needs.

Every distributed-checkpoint layout alignflow writes or reads (`alignflow.convert.sharding`, `torch_dist`) comes
from the sharded state dict of a real `GPTModel` built here, never from a table of names written by hand: the local
layer spec Megatron-LM's `pretrain_gpt.py` builds without Transformer Engine (`get_gpt_decoder_block_spec`, the MTP
block from the last decoder layer's spec), with `pre_process` / `post_process` from the pipeline stage.

CPU-only torch and megatron-core 0.16.1 need two accommodations, both scoped to model construction
(`cpu_construction`) and neither touching a number: `torch.cuda.current_device()` returns "cpu" (the router
allocates its expert-bias buffers there) and `Tensor.cuda()` returns the tensor itself (with PP > 1 the last
stage's MTP embedding copy is moved to the GPU before its first all-reduce, `LanguageModule.
setup_embeddings_and_output_layer`). A layout needs no weights: on `meta` with `perform_initialization=False`
the model costs no memory. Layouts of many ranks are planned in one process under torch's fake process group
(`torch.testing._internal.distributed.fake_pg`, which torchtitan's dry runs use too): it answers rank and world
size and runs no collective.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any
from unittest import mock

from alignflow.config.model import ModelConfig
from alignflow.config.parallel import ParallelConfig
from alignflow.errors import ConversionError

# What Megatron-LM's `_build_sharded_state_dict_metadata` gives without a distributed optimizer
# (megatron/training/checkpointing.py, core_v0.16-0.19), and what it stores as the checkpoint's content metadata;
# a torch_dist load rebuilds the model's sharded state dict from the stored one (`load_content_metadata`).
SHARDED_METADATA: dict[str, Any] = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}


def import_megatron() -> Any:
    """`megatron.core`, imported quietly (its import chain warns about missing TE/Apex and torch deprecations);
    `ConversionError` saying what to install when it is absent."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core
            import megatron.core.models.gpt.gpt_model
    except ImportError as exc:
        raise ConversionError([f"megatron-core is not installed ({exc}); distributed Megatron checkpoints are "
                               "written and read through its dist_checkpointing: pip install megatron-core"],
                              header="megatron-core needed") from None
    return megatron.core


def megatron_core_version() -> str:
    return str(import_megatron().__version__)


def transformer_config(model: ModelConfig, *, device: str = "cpu", dispatcher: str | None = None,
                       parallel: ParallelConfig | None = None, initialize: bool = True) -> Any:
    """megatron-core `TransformerConfig` for `model` at `parallel`, without TE/Apex fusions (they need CUDA
    kernels); bf16 parameters as in a `--bf16` Megatron-LM run."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    p = parallel or ParallelConfig()
    kwargs: dict[str, Any] = dict(
        num_layers=model.num_layers, hidden_size=model.hidden_size, ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads, num_query_groups=model.query_groups,
        kv_channels=model.head_dim, gated_linear_unit=model.gated_linear_unit,
        activation_func=F.silu if model.activation == "silu" else F.gelu, normalization=model.normalization,
        layernorm_epsilon=model.norm_epsilon, add_bias_linear=model.add_bias_linear, qk_layernorm=model.qk_layernorm,
        hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False, bias_dropout_fusion=False,
        bias_activation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=device in ("cpu", "meta"),
        perform_initialization=initialize, bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp, expert_model_parallel_size=p.ep,
    )
    if model.moe is not None:
        moe = model.moe
        kwargs |= dict(
            num_moe_experts=moe.num_experts, moe_router_topk=moe.router_topk, moe_ffn_hidden_size=moe.ffn_hidden_size,
            moe_shared_expert_intermediate_size=moe.shared_expert_intermediate_size,
            moe_shared_expert_gate=moe.shared_expert_gate, moe_router_score_function=moe.router_score_function,
            moe_router_enable_expert_bias=moe.router_enable_expert_bias, moe_aux_loss_coeff=moe.aux_loss_coeff,
            moe_router_load_balancing_type=moe.load_balancing_type,
            moe_layer_freq=list(moe.layer_freq) if moe.layer_freq is not None else 1,
            moe_token_dispatcher_type=dispatcher or ("alltoall" if device == "cuda" else "allgather"),
        )
    if model.mtp is not None:
        kwargs |= dict(mtp_num_layers=model.mtp.num_layers, mtp_loss_scaling_factor=model.mtp.loss_scaling_factor)
    return TransformerConfig(**kwargs)


@contextlib.contextmanager
def cpu_construction() -> Iterator[None]:
    """The two construction-time accommodations of a CPU-only torch (module docstring); undone on exit."""
    import torch

    with mock.patch("torch.cuda.current_device", return_value="cpu"), \
            mock.patch.object(torch.Tensor, "cuda", lambda self, *a, **k: self):
        yield


@contextlib.contextmanager
def cpu_collectives() -> Iterator[None]:
    """On a torch without CUDA, `torch.cuda.current_device()` is "cpu" (gloo's device): megatron-core's save and load
    finalisation all-reduce their failure counts on it (`save_state_dict_async_finalize`,
    `dist_checkpointing.load`'s validation). On a CUDA host nothing changes."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    with mock.patch("torch.cuda.current_device", return_value="cpu"):
        yield


def build_gpt_model(model: ModelConfig, *, device: str = "cpu", dispatcher: str | None = None,
                    parallel: ParallelConfig | None = None) -> Any:
    """This rank's megatron-core `GPTModel` of `model` with the local layer spec (and its MTP block), inside an
    initialised model-parallel world of `parallel`'s sizes. `device="meta"`: no weights, no initialisation."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel

    cfg = transformer_config(model, device=device, dispatcher=dispatcher, parallel=parallel,
                             initialize=device != "meta")
    place = torch.device("meta") if device == "meta" else contextlib.nullcontext()
    construction = cpu_construction() if device in ("cpu", "meta") else contextlib.nullcontext()
    with construction, place:
        layer_spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=model.normalization,
                                                vp_stage=None, pp_rank=ps.get_pipeline_model_parallel_rank())
        mtp_spec = None
        if model.mtp is not None:
            last = get_gpt_decoder_layer_specs(cfg, False, model.normalization)[-1]
            mtp_spec = get_gpt_mtp_block_spec(cfg, last, use_transformer_engine=False)
        gpt = GPTModel(config=cfg, transformer_layer_spec=layer_spec, vocab_size=padded_vocab(model, parallel),
                       max_sequence_length=model.seq_length,
                       pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                       share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
                       position_embedding_type=model.position_embedding_type, rotary_base=int(model.rotary_base),
                       rotary_percent=model.rotary_percent, mtp_block_spec=mtp_spec)
    return gpt.cuda() if device == "cuda" else gpt


def padded_vocab(model: ModelConfig, parallel: ParallelConfig | None = None) -> int:
    """Megatron-LM's `_vocab_size_with_padding`: a multiple of `make_vocab_size_divisible_by x tp`."""
    multiple = model.make_vocab_size_divisible_by * (parallel.tp if parallel is not None else 1)
    return -(-model.vocab_size // multiple) * multiple


def _initialize(parallel: ParallelConfig, *, gloo_groups: bool) -> None:
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
                                 expert_model_parallel_size=parallel.ep, create_gloo_process_groups=gloo_groups)


def _refuse_initialized() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise ConversionError(["torch.distributed is already initialised in this process; distributed checkpoint "
                               "layouts are planned in a process of their own (alignflow's CLI, or "
                               "alignflow.convert.sharding.plan_layouts, which starts one)"],
                              header="cannot build megatron-core models here")


@contextlib.contextmanager
def fake_world(rank: int, parallel: ParallelConfig) -> Iterator[None]:
    """This process as `rank` of a `parallel.world_size` world under torch's fake process group, with megatron-core's
    model-parallel state initialised; torn down on exit."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _refuse_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=parallel.world_size)
    try:
        _initialize(parallel, gloo_groups=False)
        try:
            yield
        finally:
            ps.destroy_model_parallel()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def gloo_world_of_one() -> Iterator[None]:
    """A real gloo world of one process with TP = PP = EP = 1 (what `dist_checkpointing.save` needs to plan and
    write); the rendezvous is a file store in a private temporary directory, not a TCP port."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    _refuse_initialized()
    with tempfile.TemporaryDirectory(prefix="alignflow-mcore-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            _initialize(ParallelConfig(), gloo_groups=False)
            try:
                yield
            finally:
                ps.destroy_model_parallel()
        finally:
            dist.destroy_process_group()
