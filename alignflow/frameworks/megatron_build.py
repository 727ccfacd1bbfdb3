"""Walk a `pretrain_gpt.py` command line through a real megatron-core, as deep as this machine allows.

    python -m alignflow.frameworks.megatron_build [--te-stand-in] < cases.json

Run it with the megatron-core release to check on the path (`python -m alignflow.frameworks.megatron_installs path
0.19.2`). Each case (`{"name", "argv", "checkpoint"}`: the flags after `pretrain_gpt.py`, and optionally a converted
legacy checkpoint directory) goes through these levels, each only if the one before passed; one JSON line per case
says how deep it got and, where the real code refused, its exception and the megatron-core source line that raised:

1. `flags`: Megatron-LM's argument parser (the release's flag table, `megatron_lm`), every argument at its default
   unless a flag sets it (`megatron_config.parse_args`);
2. `config`: the real `TransformerConfig` / `MLATransformerConfig` built with the keyword arguments Megatron-LM's
   `core_transformer_config_from_args` would pass (`megatron_config`): every `__post_init__` check runs;
3. `spec`: the real layer specs `pretrain_gpt.py` selects (`gpt_builders.py` of the release, in alignflow's words
   below): the decoder block spec and the MTP block spec;
4. `model`: the real `GPTModel` built from them on the CPU (local implementation only);
5. `load`: the converted checkpoint's `model_optim_rng.pt` loaded as Megatron loads it (`torch.load(weights_only=True)`
   after `import megatron.core`) into that model with `load_state_dict(strict=True)`, every tensor compared.

`--te-stand-in` is for `--transformer-impl transformer_engine` command lines: Transformer Engine cannot exist on a
CPU, so a stand-in package (`te_stand_in`) makes megatron-core import as on a TE host; levels 1-3 then run megatron-
core's own TE code paths, and levels 4-5 are not run (the stand-in computes nothing). Without it, megatron-core sees
no TE, as on a GPU host without it.

How `pretrain_gpt.py` picks its specs (gpt_builders.py up to core_v0.18.2; from core_v0.19.0 the ModelBuilder of
megatron/training/models/gpt.py, which selects the decoder the same way): an experimental attention variant
(`--experimental-attention-variant`) takes the experimental block spec, which only exists for TE
(`get_transformer_block_with_experimental_attention_variant_spec`); else MoE (`--num-experts`) takes the decoder block
spec of the implementation (`get_gpt_decoder_block_spec`); else one layer spec for every layer (TE's or the local
one). With MTP, the MTP block's inner layer is the last decoder layer's spec from `get_gpt_decoder_layer_specs`: up to
0.18 whatever the attention variant (the MTP layer gets plain attention; with DSA its first forward fails,
`megatron_refusals` row mtp-dsa-plain-mla), and on 0.19 that function asserts on any variant
(gpt_layer_specs.py:572, reached from megatron/training/models/gpt.py:409 — the path the real entry takes; 0.19's
gpt_builders.py, which takes the variant's layer specs, is no longer what pretrain_gpt.py calls). A case's `fixes`
are the side's declared Megatron fixes: with `mtp-experimental-attention` the 0.19 MTP layer is the variant's last
layer spec, as the fix makes the ModelBuilder take it.

CPU accommodations at the model level (none changes a parameter's name, shape or value): the model is initialised on
the CPU (`use_cpu_initialization`), `torch.cuda.current_device()` answers "cpu" while it is built (the router places
its expert-bias buffers there), and the MoE token dispatcher is `allgather` (`alltoall` creates a CUDA stream; both
hold the same parameters).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import traceback
import typing
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LEVELS = ("flags", "config", "spec", "model", "load")
# The first release whose pretrain_gpt.py builds through megatron/training/models/gpt.py's ModelBuilder.
MODEL_BUILDER = (0, 19)
MTP_VARIANT_FIX = "mtp-experimental-attention"  # alignflow.frameworks.megatron_fixes: the ModelBuilder's MTP spec


class Refused(Exception):
    """The real code refused at `level`."""

    def __init__(self, level: str, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.level = level
        self.error = f"{type(exc).__name__}: {exc}"
        self.where = _where(exc)


def _where(exc: BaseException) -> str | None:
    """`megatron/core/...py:LINE` of the innermost megatron-core frame that raised (None: not in megatron-core)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).as_posix()
        if "/megatron/" in path:
            return "megatron/" + path.rsplit("/megatron/", 1)[1] + f":{frame.lineno}"
    return None


def _version() -> tuple[str, tuple[int, int]]:
    from megatron.core import package_info

    text = str(package_info.__version__)
    major, minor = (int(x) for x in text.split(".")[:2])
    return text, (major, minor)


@contextlib.contextmanager
def world(device: str = "cpu") -> Iterator[None]:
    """A process group of one (gloo, or nccl on CUDA; file store) with TP = PP = 1: the specs ask how many layers
    this rank builds."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    with tempfile.TemporaryDirectory(prefix="mcore-build-") as tmp:
        if device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/store", rank=0,
                                world_size=1)
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        if device == "cuda":
            from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(1234)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def build_config(argv: list[str], series: str) -> tuple[Any, dict[str, Any]]:
    """(the real config, the settled arguments) of `pretrain_gpt.py <argv>`."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from alignflow.frameworks.megatron_config import Symbol, config_class, config_kwargs, parse_args, settle

    try:
        args = settle(parse_args(argv, series))
    except Exception as exc:
        raise Refused("flags", exc) from exc
    cls = MLATransformerConfig if config_class(args) == "MLATransformerConfig" else TransformerConfig
    kw = config_kwargs(args, {f.name for f in dataclasses.fields(cls)})
    kw = {k: v.resolve() if isinstance(v, Symbol) else v for k, v in kw.items()}
    try:
        return cls(**kw), args
    except Exception as exc:
        raise Refused("config", exc) from exc


def select_specs(config: Any, args: dict[str, Any], version: tuple[int, int],
                 fixes: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """(decoder spec, MTP block spec or None) as `pretrain_gpt.py` of `version` selects them, with the declared
    Megatron `fixes` applied (module docstring)."""
    from megatron.core.models.gpt import experimental_attention_variant_module_specs as variant
    from megatron.core.models.gpt import gpt_layer_specs as gpt

    use_te = args["transformer_impl"] == "transformer_engine"
    variant_set = args.get("experimental_attention_variant") is not None
    if variant_set:
        decoder = variant.get_transformer_block_with_experimental_attention_variant_spec(config=config, vp_stage=None)
    elif args.get("num_experts"):
        decoder = gpt.get_gpt_decoder_block_spec(config, use_transformer_engine=use_te,
                                                 normalization=args.get("normalization"),
                                                 qk_l2_norm=args.get("qk_l2_norm", False), vp_stage=None)
    else:
        decoder = _layer_spec(gpt, config, use_te)
    if args.get("mtp_num_layers") is None:
        return decoder, None
    if variant_set and version >= MODEL_BUILDER and MTP_VARIANT_FIX in fixes:
        layers = variant.get_transformer_layer_with_experimental_attention_variant_spec(config=config)
    else:
        layers = gpt.get_gpt_decoder_layer_specs(config, use_transformer_engine=use_te,
                                                 normalization=args.get("normalization"),
                                                 qk_l2_norm=args.get("qk_l2_norm", False), vp_stage=None)
    return decoder, gpt.get_gpt_mtp_block_spec(config, layers[-1], use_transformer_engine=use_te, vp_stage=None)


def _layer_spec(gpt: Any, config: Any, use_te: bool) -> Any:
    import inspect

    wanted = {"num_experts": config.num_moe_experts, "moe_grouped_gemm": config.moe_grouped_gemm,
              "qk_layernorm": config.qk_layernorm, "multi_latent_attention": config.multi_latent_attention,
              "qk_l2_norm": config.qk_l2_norm, "normalization": config.normalization}
    fn = gpt.get_gpt_layer_with_transformer_engine_spec if use_te else gpt.get_gpt_layer_local_spec
    target = gpt.get_gpt_layer_with_transformer_engine_submodules if use_te and hasattr(
        gpt, "get_gpt_layer_with_transformer_engine_submodules") else fn
    params = inspect.signature(target).parameters
    return fn(**{k: v for k, v in wanted.items() if k in params})


def padded_vocab(args: dict[str, Any], series: str) -> int:
    from alignflow.frameworks.megatron_versions import null_tokenizer

    vocab, _ = null_tokenizer(series).vocab_and_eod(int(args["vocab_size"]), args.get("null_tokenizer_eod_id"))
    divisor = int(args.get("make_vocab_size_divisible_by") or 128) * int(args.get("tensor_model_parallel_size") or 1)
    return -(-vocab // divisor) * divisor


def build_model(config: Any, args: dict[str, Any], decoder: Any, mtp: Any, series: str, device: str = "cpu") -> Any:
    """The real GPTModel on `device` (on the CPU with the module docstring's accommodations; on CUDA as is)."""
    import torch
    from megatron.core.models.gpt.gpt_model import GPTModel

    original = torch.cuda.current_device
    if device == "cpu":
        config.use_cpu_initialization = True
        if config.num_moe_experts:
            config.moe_token_dispatcher_type = "allgather"
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    try:
        return GPTModel(
            config=config, transformer_layer_spec=decoder, vocab_size=padded_vocab(args, series),
            max_sequence_length=int(args["max_position_embeddings"]), pre_process=True, post_process=True,
            fp16_lm_cross_entropy=bool(args.get("fp16_lm_cross_entropy")), parallel_output=True,
            share_embeddings_and_output_weights=not args.get("untie_embeddings_and_output_weights"),
            position_embedding_type=args["position_embedding_type"], rotary_percent=float(args["rotary_percent"]),
            rotary_base=int(args["rotary_base"]), rope_scaling=bool(args.get("use_rope_scaling")),
            mtp_block_spec=mtp)
    finally:
        torch.cuda.current_device = original


def load_checkpoint(model: Any, checkpoint: Path) -> dict[str, Any]:
    """Strict load of a legacy checkpoint as Megatron does it, then every tensor compared with the file's."""
    import torch

    tracker = (checkpoint / "latest_checkpointed_iteration.txt").read_text().strip()
    sub = "release" if tracker == "release" else f"iter_{int(tracker):07d}"
    state = torch.load(checkpoint / sub / "mp_rank_00" / "model_optim_rng.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"], strict=True)
    own = model.state_dict()
    tensors = {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
    differing = sorted(k for k, v in tensors.items() if not torch.equal(own[k].detach().cpu().to(v.dtype), v))
    if differing:
        raise ValueError(f"{len(differing)} tensors differ after the strict load: {', '.join(differing[:5])}")
    return {"tensors": len(tensors)}


def check(case: dict[str, Any], *, te_stand_in: bool, device: str = "cpu") -> dict[str, Any]:
    """One case through the levels (module docstring); `device` cuda builds the model on the GPU, with whatever
    Transformer Engine is installed there (a real one: then TE command lines reach `model` and `load` too)."""
    text, version = _version()
    series = f"{version[0]}.{version[1]}"
    levels: dict[str, str] = {}
    out: dict[str, Any] = {"name": case["name"], "megatron_core": text.split("+")[0], "device": device,
                           "transformer_engine": "stand-in (spec level only)" if te_stand_in else _te_installed(),
                           "levels": levels, "refused": None}
    argv = list(case["argv"])
    try:
        config, args = build_config(argv, series)
        levels |= {"flags": "ok", "config": f"ok: {type(config).__name__}"}
        with world(device):
            try:
                decoder, mtp = select_specs(config, args, version, tuple(case.get("fixes") or ()))
            except Exception as exc:
                raise Refused("spec", exc) from exc
            levels["spec"] = "ok: " + _describe(decoder, mtp)
            if te_stand_in:
                levels["model"] = "not run: Transformer Engine's modules cannot be built on a CPU (stand-in)"
            else:
                try:
                    model = build_model(config, args, decoder, mtp, series, device)
                except Exception as exc:
                    raise Refused("model", exc) from exc
                levels["model"] = f"ok: {sum(p.numel() for p in model.parameters())} parameters"
                if case.get("keys_out"):
                    write_key_set(model, Path(case["keys_out"]), out)
                if case.get("checkpoint"):
                    try:
                        levels["load"] = "ok: strict, {tensors} tensors equal".format(
                            **load_checkpoint(model, Path(case["checkpoint"])))
                    except Exception as exc:
                        raise Refused("load", exc) from exc
                else:
                    levels["load"] = "not run: no converted checkpoint given"
    except Refused as refused:
        done = LEVELS[:LEVELS.index(refused.level)]
        levels |= {lv: levels.get(lv, "ok") for lv in done}
        levels[refused.level] = f"refused: {refused.error}"
        out["refused"] = {"level": refused.level, "error": refused.error, "where": refused.where}
    ok = [lv for lv in LEVELS if levels.get(lv, "").startswith("ok")]
    out["reached"] = ok[-1] if ok else None
    return out


def key_set(model: Any) -> dict[str, dict[str, Any]]:
    """Every entry of the model's state dict: a tensor's shape and dtype, or an `_extra_state`'s type and encoding
    (what a strict load of a converted checkpoint must hold, `tests/data/keysets/`)."""
    import torch

    out: dict[str, dict[str, Any]] = {}
    for name, value in model.state_dict().items():
        if name.endswith("._extra_state"):
            entry: dict[str, Any] = {"extra_state": type(value).__name__}
            if isinstance(value, torch.Tensor):
                entry |= {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
            elif hasattr(value, "getvalue"):
                entry |= {"bytes": len(value.getvalue())}
            out[name] = entry
        elif isinstance(value, torch.Tensor):
            out[name] = {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
        else:
            out[name] = {"other": type(value).__name__}
    return out


def write_key_set(model: Any, path: Path, result: dict[str, Any]) -> None:
    """The model's key set as JSON at `path`, with its provenance (megatron-core, TE, torch, cuDNN)."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None  # type: ignore[no-untyped-call]
    doc = {"provenance": {"megatron_core": result["megatron_core"], "transformer_engine": result["transformer_engine"],
                          "torch": torch.__version__, "cudnn": cudnn, "device": result["device"],
                          "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
           "keys": key_set(model)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _te_installed() -> str:
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        return "absent"
    import transformer_engine

    return f"installed {getattr(transformer_engine, '__version__', '?')}"


def _describe(decoder: Any, mtp: Any) -> str:
    specs = getattr(decoder, "layer_specs", None) or [decoder]
    names = []
    for spec in specs:
        attention = getattr(getattr(spec, "submodules", None), "self_attention", None)
        module = getattr(attention, "module", None)
        names.append(getattr(module, "__name__", str(module)))
    text = f"{len(specs)} decoder layer spec(s) [{', '.join(sorted(set(names)))}]"
    layers = getattr(mtp, "layer_specs", None)
    return text + (f", MTP block of {len(layers)}" if layers else ", no MTP")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m alignflow.frameworks.megatron_build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--te-stand-in", action="store_true", help="megatron-core sees a stand-in Transformer Engine")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model is built")
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if not hasattr(typing, "override"):  # megatron-core 0.17+ imports typing.override (Python 3.12); a no-op here
        typing.override = lambda f: f  # type: ignore[attr-defined]
    if opts.te_stand_in:
        from alignflow.frameworks import te_stand_in
        from alignflow.frameworks.megatron_versions import TE_STAND_IN_VERSION

        te_stand_in.install(TE_STAND_IN_VERSION)
    cases = json.load(sys.stdin)
    for case in cases:
        sys.stdout.write(json.dumps(check(case, te_stand_in=opts.te_stand_in, device=opts.device)) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
