"""Load a converted Megatron legacy checkpoint into a real megatron-core GPTModel with `strict=True`.

    python benchmarks/megatron_load_check.py CKPT_DIR --spec twin-moe [--device cpu|cuda] [--json]

Builds the model of the spec's default configuration (or `--experiment FILE`'s model section) with the LOCAL
layer spec (`--transformer-impl local`), MTP block included, loads `model_optim_rng.pt` the way Megatron does
(`torch.load(weights_only=True)` after `import megatron.core`), calls `load_state_dict(strict=True)` and then
checks that every tensor in the model equals the checkpoint's bit for bit. Exit 0 when all holds, 1 otherwise.

Written to run unchanged on a CPU with megatron-core 0.16.1 (the test suite) and on a GPU with a newer
megatron-core (the MTP inner layer name follows the installed version: `transformer_layer` up to 0.16,
`mtp_model_layer` from 0.17; convert with the same `--megatron-version`).

CPU-only torch and megatron-core 0.16.1 need two accommodations, both scoped to model construction:
- the MoE token dispatcher is `allgather` (`alltoall` creates a CUDA stream);
- `torch.cuda.current_device` is redirected to "cpu" while the model is built, because the router allocates
  its expert-bias buffers on `torch.cuda.current_device()`. This monkeypatch is undone as soon as the model
  exists; nothing else is faked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F

from alignflow.config.model import ModelConfig
from alignflow.convert import load_spec
from alignflow.convert.megatron import open_megatron
from alignflow.convert.plan import mtp_inner_layer


def megatron_version() -> str:
    import megatron.core

    return str(megatron.core.__version__)


@contextmanager
def model_parallel(device: str) -> Iterator[None]:
    """A world of one (gloo on CPU, nccl on CUDA) with TP = PP = 1; torn down on exit.

    The rendezvous is a file store in a private temporary directory, not a TCP port: tests run beside other
    processes on shared machines, and a fixed MASTER_PORT collides.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if device == "cuda":
        torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory(prefix="mcore-world-") as tmp:
        created = not dist.is_initialized()
        if created:
            dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/store",
                                    rank=0, world_size=1)
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        if device == "cuda":
            model_parallel_cuda_manual_seed(1234)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
            if created:
                dist.destroy_process_group()


def transformer_config(model: ModelConfig, *, device: str, dispatcher: str | None = None) -> Any:
    """megatron-core `TransformerConfig` for `model`, without TE/Apex fusions (they need CUDA kernels)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs: dict[str, Any] = dict(
        num_layers=model.num_layers, hidden_size=model.hidden_size, ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads, num_query_groups=model.query_groups,
        kv_channels=model.head_dim, gated_linear_unit=model.gated_linear_unit,
        activation_func=F.silu if model.activation == "silu" else F.gelu, normalization=model.normalization,
        layernorm_epsilon=model.norm_epsilon, add_bias_linear=model.add_bias_linear, qk_layernorm=model.qk_layernorm,
        hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False, bias_dropout_fusion=False,
        bias_activation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=device == "cpu",
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
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


def build_gpt_model(model: ModelConfig, *, device: str = "cpu", dispatcher: str | None = None) -> Any:
    """A megatron-core GPTModel of `model` with the local layer spec (and its MTP block)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel

    cfg = transformer_config(model, device=device, dispatcher=dispatcher)
    patch = mock.patch("torch.cuda.current_device", return_value="cpu") if device == "cpu" else _nothing()
    with patch:
        layer_spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization=model.normalization)
        mtp_spec = None
        if model.mtp is not None:
            last = get_gpt_decoder_layer_specs(cfg, False, model.normalization)[-1]
            mtp_spec = get_gpt_mtp_block_spec(cfg, last, use_transformer_engine=False)
        gpt = GPTModel(config=cfg, transformer_layer_spec=layer_spec, vocab_size=model.padded_vocab_size,
                       max_sequence_length=model.seq_length,
                       share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
                       position_embedding_type=model.position_embedding_type, rotary_base=int(model.rotary_base),
                       rotary_percent=model.rotary_percent, mtp_block_spec=mtp_spec)
    return gpt.cuda() if device == "cuda" else gpt


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def load_into(gpt: Any, ckpt_dir: Path) -> dict[str, Any]:
    """`load_state_dict(strict=True)` of the checkpoint, then a bit-exact comparison of every tensor."""
    import megatron.core  # noqa: F401 - Megatron's weights_only safe globals, as in a real load

    with open_megatron(ckpt_dir) as ckpt:
        state = {k: ckpt.read(k) for k in ckpt.tensors} | dict(ckpt.others)
    result = gpt.load_state_dict(state, strict=True)
    loaded = gpt.state_dict()
    differing = []
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and not key.endswith("._extra_state"):
            mine = loaded[key].detach().cpu().to(value.dtype)
            if mine.shape != value.shape or not torch.equal(mine, value):
                differing.append(key)
    params = [k for k, v in loaded.items() if isinstance(v, torch.Tensor) and not k.endswith("._extra_state")]
    return {"strict_load": str(result), "model_tensors": len(params), "checkpoint_tensors": len(ckpt.tensors),
            "differing": differing, "ok": not differing and len(params) == len(ckpt.tensors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="Megatron legacy checkpoint directory (tracker inside)")
    parser.add_argument("--spec", required=True, help="conversion spec name or file (gives the model)")
    parser.add_argument("--experiment", type=Path, help="take the model section of this experiment instead")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dispatcher", choices=["allgather", "alltoall"], help="MoE token dispatcher")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    model = load_spec(args.spec).model
    if args.experiment is not None:
        from alignflow.config import load_experiment

        model = load_experiment(args.experiment).model
    version = megatron_version()
    with model_parallel(args.device):
        gpt = build_gpt_model(model, device=args.device, dispatcher=args.dispatcher)
        try:
            report = load_into(gpt, args.checkpoint)
        except RuntimeError as exc:  # load_state_dict(strict=True): missing / unexpected keys, size mismatch
            report = {"ok": False, "error": str(exc)}
    report |= {"megatron_core": version, "mtp_inner_layer": mtp_inner_layer(version), "spec": args.spec,
               "device": args.device}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        status = "OK" if report["ok"] else "FAILED"
        print(f"{status}: {args.checkpoint} into megatron-core {version} GPTModel ({args.spec}, {args.device})")
        for key, value in report.items():
            print(f"  {key}: {value}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
