"""Step-1 parity through REAL megatron-core on a GPU: converted checkpoint -> GPTModel forward on the twin's batch 1.

    python benchmarks/megatron_gpu_parity.py CKPT_DIR --preset twin-moe --data DATA --npu-log LOG [--json]

The strongest end-to-end check of the conversion that does not need an Ascend box: the MindSpore twin trains
from the bf16 checkpoint and logs its step-1 lm loss and mtp_1 loss (a forward pass on batch 1 before any update);
real megatron-core (local spec, fp32, TF32 off, alltoall dispatcher) loads the Megatron checkpoint converted from
the same bf16 weights with `strict=True` and computes the same two losses on the same batch. They must agree to
fp32 rounding (docs/seeds.md#early-gate asks 0.005% of the real pair in bf16). The PyTorch twin's forward is reported
too.

Needs CUDA and a megatron-core that builds MTP (>= 0.16); the MTP inner layer name follows the installed version.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from alignflow.logs import parse_log  # noqa: E402
from alignflow.twin.data import TokenData, load_data  # noqa: E402
from alignflow.twin.presets import preset, twin_spec  # noqa: E402


def build_megatron(name: str) -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    model = preset(name)
    moe = model.moe
    cfg = TransformerConfig(
        num_layers=model.num_layers, hidden_size=model.hidden_size, num_attention_heads=model.num_attention_heads,
        num_query_groups=model.query_groups, kv_channels=model.head_dim, ffn_hidden_size=model.ffn_hidden_size,
        gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm", layernorm_epsilon=model.norm_epsilon,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False,
        bias_dropout_fusion=False, bias_activation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        num_moe_experts=moe.num_experts if moe else None, moe_router_topk=moe.router_topk if moe else 2,
        moe_ffn_hidden_size=moe.ffn_hidden_size if moe else None,
        moe_shared_expert_intermediate_size=moe.shared_expert_intermediate_size if moe else None,
        moe_shared_expert_gate=bool(moe and moe.shared_expert_gate),
        moe_layer_freq=list(moe.layer_freq) if moe and moe.layer_freq else 1,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=moe.aux_loss_coeff if moe else 0.0,
        moe_router_score_function=moe.router_score_function if moe else "softmax",
        moe_router_enable_expert_bias=bool(moe and moe.router_enable_expert_bias),
        moe_token_dispatcher_type="alltoall",
        mtp_num_layers=model.mtp.num_layers if model.mtp else None,
        mtp_loss_scaling_factor=model.mtp.loss_scaling_factor if model.mtp else 0.1)
    layer_spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False, normalization="RMSNorm")
    mtp_spec = get_gpt_mtp_block_spec(cfg, get_gpt_decoder_layer_specs(cfg, False, "RMSNorm")[-1],
                                      use_transformer_engine=False) if model.mtp else None
    return GPTModel(config=cfg, transformer_layer_spec=layer_spec, vocab_size=model.vocab_size,
                    max_sequence_length=model.seq_length, share_embeddings_and_output_weights=False,
                    position_embedding_type="rope", rotary_base=int(model.rotary_base), mtp_block_spec=mtp_spec)


def checkpoint_state(ckpt: Path) -> dict[str, Any]:
    import megatron.core  # noqa: F401 - registers Megatron's weights_only safe globals, as in a real load

    it = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
    sub = "release" if it == "release" else f"iter_{int(it):07d}"
    state = torch.load(ckpt / sub / "mp_rank_00" / "model_optim_rng.pt", map_location="cpu", weights_only=True)
    return dict(state["model"])


def megatron_losses(name: str, ckpt: Path, data: TokenData, gbs: int) -> dict[str, float]:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    model = build_megatron(name).cuda().float()
    sd = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
          for k, v in checkpoint_state(ckpt).items()}
    result = model.load_state_dict(sd, strict=True)
    # training mode, as pretrain_gpt.py's first iteration: megatron-core logs the MTP loss only while training
    # (`process_mtp_loss(is_training=...)`); dropout is 0 and nothing random runs, so the forward is the same
    model.train()
    batch = torch.from_numpy(data.batch(0, gbs)).cuda()
    ids, labels = batch[:, :-1], batch[:, 1:]
    s = ids.shape[1]
    pos = torch.arange(s, device="cuda").unsqueeze(0).expand(ids.shape[0], -1)
    mask = torch.ones(ids.shape, device="cuda")
    tracker = MTPLossLoggingHelper.tracker
    tracker.clear()
    with torch.no_grad():
        per_token = model(ids, pos, None, labels=labels, loss_mask=mask)
    out = {"lm_loss": float(per_token.float().mean())}
    values = tracker.get("loss_values", tracker.get("values"))  # the key is "loss_values" from core 0.17 on
    if values is not None:
        out["mtp_1_loss"] = float(values[0])
    out["strict_load"] = str(result)
    return out


def twin_losses(name: str, ckpt: Path, data: TokenData, gbs: int, version: str) -> dict[str, float]:
    from alignflow.twin.flavours import megatron_layout, mtp_inner_name
    from alignflow.twin.torch_checkpoint import load_checkpoint
    from alignflow.twin.torch_model import TwinGPTTorch

    model = TwinGPTTorch(twin_spec(preset(name)), mtp_inner_name=mtp_inner_name(version))
    layout = megatron_layout(list(model.state_dict()), "local", grouped_gemm=False)
    load_checkpoint(model, ckpt, layout, finetune=True, where="parity")
    model.cuda()
    batch = torch.from_numpy(data.batch(0, gbs)).cuda()
    with torch.no_grad():
        out = model(batch[:, :-1], batch[:, 1:], 1.0)
    result = {"lm_loss": float(out.lm_sum / out.num_tokens)}
    if out.mtp_means:
        result["mtp_1_loss"] = float(out.mtp_means[0])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--data", type=Path, required=True, help="indexed dataset prefix (PREFIX.bin + .idx)")
    ap.add_argument("--npu-log", type=Path, help="the MindSpore twin's log of a training from the bf16 checkpoint")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--gbs", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import megatron.core
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    torch.cuda.set_device(0)
    store = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(args.seed)
    model = preset(args.preset)
    data = load_data(args.data, seq_length=model.seq_length, seed=args.seed, vocab_size=model.vocab_size,
                     samples_needed=args.gbs, expected_sha256=None, where="parity")
    version = str(megatron.core.__version__)
    report: dict[str, Any] = {"preset": args.preset, "megatron_core": version, "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(0)}
    report["megatron"] = megatron_losses(args.preset, args.ckpt, data, args.gbs)
    report["twin_torch"] = twin_losses(args.preset, args.ckpt, data, args.gbs, ".".join(version.split(".")[:2]))
    if args.npu_log:
        frame = parse_log(args.npu_log.read_text().splitlines(), fmt="mindformers").frame
        report["mindspore_step1"] = {k: float(frame.loc[1, k]) for k in ("lm_loss", "mtp_1_loss") if k in frame}
    ref = report["megatron"]
    rel = {}
    for side in ("twin_torch", "mindspore_step1"):
        for k in ("lm_loss", "mtp_1_loss"):
            if side in report and k in report[side] and k in ref:
                rel[f"{side}.{k}"] = abs(report[side][k] - ref[k]) / abs(ref[k])
    report["rel_diff_vs_megatron"] = rel
    print(json.dumps(report, indent=2))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    ok = all(v < 1e-5 for v in rel.values())
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    sys.exit(main())
