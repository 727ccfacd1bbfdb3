"""Megatron-LM backend: `pretrain_gpt.py` flags generated from the experiment's model and training sections, on
either side — on a GPU host, or on an Ascend host through MindSpeed.

The flags that decide alignment are not left to templates: the model shape comes from `ModelConfig`, the
optimisation from `TrainingConfig`, and the load path is pinned with `--finetune --no-load-optim --no-load-rng
--ckpt-format torch|torch_dist` (the converted checkpoint's format, `conversion.format`; weights only, schedule and
data from step 0 — the equivalent of MindFormers' `no_load_optim: True`), `--log-interval 1` (per-step lines;
Megatron prints its first iteration always and does not reset its loss accumulators after it) and
`--dataloader-type single` (`cyclic` adds a second shuffle). `--exit-on-missing-checkpoint` does not make Megatron
fail (it exits 0), which is why the log sentinels exist.

What depends on the megatron-core version and on the GPU host is `alignflow.frameworks.megatron_versions`: the
NullTokenizer's vocabulary and EOD flags (alignment data is pre-tokenized; the padded vocabulary must equal the
NPU side's, since padded rows enter the softmax), the fused kernels the host's extensions allow
(`gpu.extensions`, filled from hosts.yaml's `cuda_extensions`), the environment `--deterministic-mode` checks.
`--data-cache-path {out}/data_cache` keeps GPTDataset's index cache out of the data directory (whose fingerprint
is the data's sha256).

`gpu.extra_args` holds what the generator cannot know (TE options, a tokenizer of the user's own); a flag given
there *replaces* the generated one instead of being appended after it, so the command line states every setting
once — and preflight reads the result with Megatron's own semantics either way.

On an Ascend host (`alignflow.frameworks.ascend`) the entry is MindSpeed-LLM's `pretrain_gpt.py`, which imports
`mindspeed_llm.megatron_adaptor` before Megatron; a plain Megatron-LM entry gets `<side>.adaptor`
(`mindspeed.megatron_adaptor`) imported first by a short launcher the step writes into its directory. Determinism
there is MindSpeed's switch (`--use-deter-comp` / `--npu-deterministic`) with HCCL's deterministic collectives, not
`--deterministic-mode` (which checks CUDA's NCCL and NVTE settings); `devices` renders `ASCEND_RT_VISIBLE_DEVICES`
(`CUDA_VISIBLE_DEVICES` on a GPU host).

The PyTorch twin takes exactly these flags (`alignflow.backends.twin`): a command line that trains the
twin is one that real Megatron-LM accepts, and the twin's own settings travel in its environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from alignflow.backends.launch import layout_for, parallel_flags, torchrun
from alignflow.backends.registry import Backend, SideFormats, megatron_load_format, own_config, register
from alignflow.backends.template import CommandTemplate, MegatronArgs, TrainSpec
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import CudaExtension
from alignflow.config.model import ModelConfig, TrainingConfig
from alignflow.config.sides import SideConfig
from alignflow.errors import ConfigError
from alignflow.frameworks.ascend import (
    DEVICE_VARIABLE,
    HCCL_DETERMINISM_ENV,
    MINDSPEED_ADAPTOR,
    MINDSPEED_LLM_ADAPTOR,
    adaptor_bootstrap,
    deterministic_flag,
)
from alignflow.frameworks.megatron_fixes import LAUNCHER as FIX_LAUNCHER
from alignflow.frameworks.megatron_fixes import SHIPPED_FIXES, MegatronFix, resolve_fix
from alignflow.frameworks.megatron_fixes import launcher as fix_launcher
from alignflow.frameworks.megatron_versions import (
    accepted_problem,
    determinism_env,
    kernel_flags,
    null_tokenizer,
)
from alignflow.pipeline import side


def _num(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() or abs(value) < 1 else str(int(value))


def megatron_vocab_flags(model: ModelConfig, megatron_version: str) -> list[str]:
    """NullTokenizer flags for `model.vocab_size` ids, EOD the last (`--vocab-size V-1` up to 0.17, `--vocab-size V
    --null-tokenizer-eod-id V-1` from 0.18) and `--make-vocab-size-divisible-by D`, refusing a D that would pad."""
    d = model.make_vocab_size_divisible_by
    padded = -(-model.vocab_size // d) * d  # the tokenizer holds V ids on every version
    if padded != model.vocab_size:
        raise ConfigError(f"model.vocab_size {model.vocab_size} is not a multiple of make_vocab_size_divisible_by "
                          f"{d}: Megatron would pad the embedding to {padded} rows, and padded rows change the loss")
    return [*null_tokenizer(megatron_version).flags(model.vocab_size), "--make-vocab-size-divisible-by", str(d)]


def model_flags(model: ModelConfig, *, transformer_impl: str = "local", megatron_version: str = "0.16") -> list[str]:
    """Flags of the model shape (`--num-layers ...`)."""
    if model.activation == "gelu" and model.gated_linear_unit:
        raise ConfigError(
            f"model: activation gelu with gated_linear_unit cannot be expressed with pretrain_gpt.py flags "
            f"(--swiglu means silu); family {model.family}"
        )
    f: list[str] = [
        "--num-layers", str(model.num_layers),
        "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.num_attention_heads),
    ]
    if model.num_query_groups is not None and model.num_query_groups != model.num_attention_heads:
        f += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    if model.kv_channels is not None:
        f += ["--kv-channels", str(model.kv_channels)]
    f += ["--seq-length", str(model.seq_length),
          "--max-position-embeddings", str(model.max_position_embeddings or model.seq_length)]
    f += ["--position-embedding-type", model.position_embedding_type]
    if model.position_embedding_type == "rope":
        f += ["--rotary-base", _num(model.rotary_base)]
        if model.rotary_percent != 1.0:
            f += ["--rotary-percent", _num(model.rotary_percent)]
    f += ["--normalization", model.normalization, "--norm-epsilon", _num(model.norm_epsilon)]
    if model.zero_centered_gamma:
        f.append("--apply-layernorm-1p")
    if model.gated_linear_unit and model.activation == "silu":
        f.append("--swiglu")
    if not model.add_bias_linear:
        f.append("--disable-bias-linear")
    if model.qk_layernorm:
        f.append("--qk-layernorm")
    if model.attention_output_gate:
        f.append("--attention-output-gate")
    if model.untie_embeddings_and_output_weights:
        f.append("--untie-embeddings-and-output-weights")
    f += ["--tokenizer-type", "NullTokenizer", *megatron_vocab_flags(model, megatron_version)]
    f += ["--attention-dropout", _num(model.attention_dropout), "--hidden-dropout", _num(model.hidden_dropout)]
    f += ["--init-method-std", _num(model.init_method_std)]
    if model.moe is not None:
        f += _moe_flags(model, transformer_impl=transformer_impl)
    if model.mtp is not None:
        f += ["--mtp-num-layers", str(model.mtp.num_layers),
              "--mtp-loss-scaling-factor", _num(model.mtp.loss_scaling_factor)]
    if model.linear_attention is not None:
        la = model.linear_attention
        f += ["--experimental-attention-variant", "gated_delta_net",
              "--linear-attention-freq", str(la.freq),
              "--linear-conv-kernel-dim", str(la.conv_kernel_dim),
              "--linear-key-head-dim", str(la.key_head_dim),
              "--linear-value-head-dim", str(la.value_head_dim),
              "--linear-num-key-heads", str(la.num_key_heads),
              "--linear-num-value-heads", str(la.num_value_heads)]
    if model.mla is not None:
        mla = model.mla
        f.append("--multi-latent-attention")
        if mla.q_lora_rank is not None:
            f += ["--q-lora-rank", str(mla.q_lora_rank)]
        f += ["--kv-lora-rank", str(mla.kv_lora_rank), "--qk-head-dim", str(mla.qk_head_dim),
              "--qk-pos-emb-head-dim", str(mla.qk_pos_emb_head_dim), "--v-head-dim", str(mla.v_head_dim)]
    if model.dsa is not None:
        dsa = model.dsa
        f += ["--experimental-attention-variant", "dsa",
              "--dsa-indexer-n-heads", str(dsa.index_n_heads),
              "--dsa-indexer-head-dim", str(dsa.index_head_dim),
              "--dsa-indexer-topk", str(dsa.index_topk),
              "--dsa-indexer-loss-coeff", _num(dsa.indexer_loss_coeff)]
    return f


def _moe_flags(model: ModelConfig, *, transformer_impl: str) -> list[str]:
    moe = model.moe
    assert moe is not None
    f = ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.router_topk),
         "--moe-ffn-hidden-size", str(moe.ffn_hidden_size)]
    if moe.shared_expert_intermediate_size is not None:
        f += ["--moe-shared-expert-intermediate-size", str(moe.shared_expert_intermediate_size)]
    if moe.shared_expert_gate:
        f.append("--moe-shared-expert-gate")
    f += ["--moe-router-score-function", moe.router_score_function]
    if moe.router_enable_expert_bias:
        f += ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", _num(moe.router_bias_update_rate)]
    if moe.router_topk_scaling_factor is not None:
        f += ["--moe-router-topk-scaling-factor", _num(moe.router_topk_scaling_factor)]
    f += ["--moe-router-load-balancing-type", moe.load_balancing_type]
    if moe.load_balancing_type != "none":
        f += ["--moe-aux-loss-coeff", _num(moe.aux_loss_coeff)]
    if moe.z_loss_coeff is not None:
        f += ["--moe-z-loss-coeff", _num(moe.z_loss_coeff)]
    if moe.layer_freq is not None:
        f += ["--moe-layer-freq", "[" + ",".join(str(int(x)) for x in moe.layer_freq) + "]"]
    if moe.router_dtype is not None:
        f += ["--moe-router-dtype", moe.router_dtype]
    f += ["--moe-token-dispatcher-type", "alltoall"]
    if transformer_impl == "transformer_engine":
        f.append("--moe-grouped-gemm")
    return f


def training_flags(training: TrainingConfig, *, steps: int) -> list[str]:
    """Optimisation flags; the schedule is the same function of the step on both sides.

    A training shorter than the experiment's (the early gate's 2 steps) keeps the long training's schedule:
    `--lr-decay-iters` stays at the experiment's decay length, so warm-up and decay are not squeezed into 2 steps
    (and Megatron's `lr_warmup_steps < lr_decay_steps` assertion holds).
    """
    warmup = training.lr_warmup_iters
    decay = training.lr_decay_iters or training.steps
    if decay <= warmup:
        if training.lr_decay_style != "constant":
            raise ConfigError(f"training: lr_decay_iters {decay} must exceed lr_warmup_iters {warmup} (Megatron "
                              "asserts lr_warmup_steps < lr_decay_steps)")
        decay = warmup + 1  # constant after the warm-up: any decay length past it is the same schedule
    f = ["--seed", str(training.seed), "--train-iters", str(steps),
         "--lr", _num(training.lr), "--min-lr", _num(training.min_lr),
         "--lr-warmup-iters", str(warmup), "--lr-decay-style", training.lr_decay_style]
    if training.lr_decay_iters is not None or decay != steps:
        f += ["--lr-decay-iters", str(decay)]
    f += ["--weight-decay", _num(training.weight_decay),
          "--adam-beta1", _num(training.adam_beta1), "--adam-beta2", _num(training.adam_beta2),
          "--adam-eps", _num(training.adam_eps), "--clip-grad", _num(training.clip_grad),
          "--micro-batch-size", str(training.micro_batch_size),
          "--global-batch-size", str(training.global_batch_size)]
    if training.bf16:
        f.append("--bf16")
    if training.recompute == "full":  # every layer's activations recomputed in the backward (megatron arguments.py)
        f += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return f


def merge_flags(generated: Sequence[str], extra: Sequence[str]) -> list[str]:
    """`generated` with every flag that `extra` also gives removed, then `extra`: one value per flag.

    A flag owns the tokens after it up to the next `--flag` (Megatron flag values never start with `--`).
    """
    def groups(argv: Sequence[str]) -> list[list[str]]:
        out: list[list[str]] = []
        for token in argv:
            if token.startswith("--") or not out:
                out.append([token])
            else:
                out[-1].append(token)
        return out

    given = {g[0].split("=", 1)[0] for g in groups(extra)}
    kept = [g for g in groups(generated) if g[0].split("=", 1)[0] not in given]
    return [t for g in kept for t in g] + list(extra)


def pretrain_flags(
    model: ModelConfig,
    training: TrainingConfig,
    *,
    steps: int,
    data_path: str,
    load: str | None,
    transformer_impl: str,
    megatron_version: str,
    extensions: Sequence[str] | None = None,
    data_cache_path: str | None = "{out}/data_cache",
    save: str | None = None,
    save_interval: int | None = None,
    extra_args: Sequence[str] = (),
    ckpt_format: str = "torch",
    attention_backend: str | None = None,
) -> list[str]:
    """The complete `pretrain_gpt.py` argument list of an alignment training on megatron-core `megatron_version`,
    on a host with `extensions` (None: not known, no fused kernel that needs one); `ckpt_format` is the format of
    the checkpoint it loads (and saves)."""
    f = ["--transformer-impl", transformer_impl]
    if transformer_impl == "transformer_engine":  # the attention kernels decide the numerics: never left implicit
        f += ["--attention-backend", attention_backend or "auto"]
    f += model_flags(model, transformer_impl=transformer_impl, megatron_version=megatron_version)
    f += training_flags(training, steps=steps)
    f += ["--data-path", data_path, "--split", "100,0,0", "--dataloader-type", "single"]
    if data_cache_path is not None:
        f += ["--data-cache-path", data_cache_path]
    if load is not None:
        f += ["--load", load, "--finetune", "--no-load-optim", "--no-load-rng", "--exit-on-missing-checkpoint"]
    if save is not None:
        f += ["--save", save, "--save-interval", str(save_interval or steps)]
    f += ["--ckpt-format", ckpt_format, "--log-interval", "1", "--eval-iters", "0",
          "--eval-interval", str(max(steps, 1) * 10)]
    if training.deterministic:
        f.append("--deterministic-mode")
    kernels = kernel_flags(transformer_impl=transformer_impl, normalization=model.normalization,
                           rope=model.position_embedding_type == "rope", extensions=extensions,
                           dsa=model.dsa is not None)
    if training.bias_swiglu_fusion:  # megatron's default: SwiGLUFunction (torch code, needs no extension)
        kernels = [k for k in kernels if k != "--no-bias-swiglu-fusion"]
    f += kernels
    return merge_flags(f, extra_args)


class MegatronConfig(SideConfig):
    """Megatron-LM's `pretrain_gpt.py` — on a GPU host, or on an Ascend host through MindSpeed (MindSpeed-LLM's
    `pretrain_gpt.py`, or a plain Megatron-LM entry with MindSpeed's adaptor imported first)."""

    kind: Literal["megatron"] = Field("megatron", description="Megatron-LM (MindSpeed on an NPU host).")
    entry: str = Field(description="Path of pretrain_gpt.py on the host: Megatron-LM's, or MindSpeed-LLM's on an "
                       "Ascend host.")
    adaptor: str | None = Field(
        None, description="Ascend host only: a module imported before Megatron's, for an entry that does not import "
        f"one itself (MindSpeed core: `{MINDSPEED_ADAPTOR}` with Megatron-LM's pretrain_gpt.py). Left out, the entry "
        f"is MindSpeed-LLM's, which imports `{MINDSPEED_LLM_ADAPTOR}` itself.")
    torchrun: dict[str, Any] | None = Field(
        None, description="Run under torchrun with these options (nproc_per_node, master_port).")
    transformer_impl: Literal["local", "transformer_engine"] = Field(
        "local", description="`--transformer-impl`; also picks the converted checkpoint's flavour.")
    megatron_version: str = Field("0.16", description="megatron-core version on the host: the flags it accepts, "
                                  "NullTokenizer's vocabulary and EOD id, the MTP layer's name.")
    extensions: list[CudaExtension] | None = Field(
        None, description="What the GPU host has besides PyTorch (transformer_engine, apex): picks Megatron's fused "
        "kernels. Left out, it is filled in from hosts.yaml (`cuda_extensions` of the side's training host) when the "
        "experiment is loaded with an inventory, and recorded with the run; without either, none.")
    devices: list[int] | None = Field(
        None, description="Accelerator ids the training may use (CUDA_VISIBLE_DEVICES on a GPU host, "
        "ASCEND_RT_VISIBLE_DEVICES on an Ascend host); left out: every device of the host.")
    extra_args: list[str] = Field(default_factory=list, description="Flags appended to the generated ones (a flag "
                                  "given here replaces the generated one).")
    fixes: list[str] = Field(default_factory=list, description="Declared fixes of Megatron-LM run before the entry by "
                             f"the step's launcher: ones alignflow ships ({', '.join(SHIPPED_FIXES)}) or .py files "
                             "of yours (relative to the experiment); recorded with their sha256.")
    attention_backend: Literal["flash", "fused", "unfused", "local", "auto"] | None = Field(
        None, description="`--attention-backend` (Transformer Engine implementation; both sides' attention kernels "
        "are compared by preflight). Left out: `auto` is rendered, TE's own choice; a TE × cuDNN pair known to fail "
        "in fused attention is named by `preflight --check-hosts`.")
    repo: str | None = Field("megatron-lm", description="Name under the host's `repos:` whose git commit versions "
                             "the side (part of each step's cache key).")


def _command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """`pretrain_gpt.py <flags>` for one training: under torchrun for more than one process (from the layout,
    `alignflow.backends.launch`) or when `<side>.torchrun` asks for it; on an Ascend host with MindSpeed's adaptor
    and NPU determinism."""
    cfg = own_config(experiment, spec.side, MegatronConfig)
    problem = accepted_problem(cfg.megatron_version)  # real Megatron-LM only on a checked release (the twin mimics)
    if problem is not None:
        raise ConfigError(f"{spec.side}.megatron_version: {problem}")
    role = spec.role or side(spec.side).role
    layout = spec.layout or layout_for(experiment.parallel(spec.side), None, side=spec.side)
    npu = role == "ascend"
    extra = [*parallel_flags(layout.parallel), *cfg.extra_args]
    if npu and experiment.training.deterministic and "--deterministic-mode" not in cfg.extra_args:
        # MindSpeed's own switch; Megatron's --deterministic-mode checks CUDA's NCCL/NVTE settings
        extra = [deterministic_flag(cfg.adaptor or MINDSPEED_LLM_ADAPTOR), *extra]
    flags = pretrain_flags(experiment.model, experiment.training, steps=spec.steps, data_path=spec.data,
                           load=spec.load, transformer_impl=cfg.transformer_impl,
                           megatron_version=cfg.megatron_version, extensions=cfg.extensions,
                           save=spec.save, save_interval=experiment.training.save_interval if spec.save else None,
                           extra_args=extra,
                           ckpt_format=megatron_load_format(experiment, spec, layout.parallel),
                           attention_backend=cfg.attention_backend)
    if npu:
        flags = [f for f in flags if f != "--deterministic-mode"]
    files: dict[str, str] = {}
    entry = cfg.entry
    fixes = declared_fixes(experiment, spec.side, cfg)
    if npu and cfg.adaptor is not None and not fixes:
        files[ADAPTOR_LAUNCHER] = adaptor_bootstrap(cfg.adaptor, cfg.entry)
        entry = f"{{out}}/{ADAPTOR_LAUNCHER}"
    elif cfg.adaptor is not None and not npu:
        raise ConfigError(f"{spec.side}.adaptor {cfg.adaptor}: an adaptor is for an Ascend host; {spec.step} runs on a "
                          f"{role} host")
    if fixes:
        files[FIX_LAUNCHER] = fix_launcher(fixes, cfg.entry, adaptor=cfg.adaptor if npu else None)
        files |= {f.file_name: f.source for f in fixes}
        entry = f"{{out}}/{FIX_LAUNCHER}"
    argv, launch_env = torchrun(layout, [entry, *flags], cfg.torchrun)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", **launch_env}
    if cfg.devices is not None:
        if len(cfg.devices) < layout.per_node:
            raise ConfigError(f"{spec.side}.devices {cfg.devices}: {layout.per_node} process(es) per node need as "
                              "many devices")
        env[DEVICE_VARIABLE[role]] = ",".join(str(d) for d in cfg.devices)
    if experiment.training.deterministic:
        env |= HCCL_DETERMINISM_ENV if npu else determinism_env()
    return CommandTemplate(
        argv=tuple(argv),
        log_format="megatron",
        code_version=f"entry {cfg.entry}" + (f" adaptor {cfg.adaptor}" if cfg.adaptor else "")
        + "".join(f" fix {f.label()}" for f in fixes),
        files=files,
        env={**env, **cfg.env},
        checkpoint="checkpoint" if spec.save else None,
        required_lines=("successfully loaded checkpoint from",) if spec.load else (),
        code_repo=cfg.repo,
        code_files={f"megatron fix {f.name}": f.file_name for f in fixes},
    )


ADAPTOR_LAUNCHER = "mindspeed_launch.py"


def declared_fixes(experiment: Experiment, side_name: str, cfg: MegatronConfig) -> tuple[MegatronFix, ...]:
    """`<side>.fixes` resolved (a user's file relative to the experiment), each checked against the side's
    megatron-core series."""
    base = Path(experiment.source).parent if experiment.source else None
    out = []
    for name in cfg.fixes:
        fix = resolve_fix(name, base=base)
        series = ".".join(cfg.megatron_version.split(".")[:2])
        if fix.releases is not None and series not in fix.releases:
            raise ConfigError(f"{side_name}.fixes: {name} is written for megatron-core {', '.join(fix.releases)}, "
                              f"not {cfg.megatron_version} ({side_name}.megatron_version)")
        out.append(fix)
    return tuple(out)


def _settings(experiment: Experiment, spec: TrainSpec, template: CommandTemplate) -> MegatronArgs:
    cfg = own_config(experiment, spec.side, MegatronConfig)
    launcher = next((n for n in (FIX_LAUNCHER, ADAPTOR_LAUNCHER) if n in template.files), None)
    entry = f"{{out}}/{launcher}" if launcher else cfg.entry
    argv = template.argv
    if entry not in argv:
        raise ConfigError(f"{experiment.source or experiment.name}: the {spec.step} command does not run {entry} "
                          f"(steps.{spec.step}.command replaces it?): preflight cannot read its Megatron flags")
    role = spec.role or side(spec.side).role
    return MegatronArgs(argv[argv.index(entry) + 1:], cfg.megatron_version,
                        tuple(cfg.extensions) if cfg.extensions is not None else None, real=True, entry=cfg.entry,
                        role=role, adaptor=cfg.adaptor,
                        fixes=tuple(f.label() for f in declared_fixes(experiment, spec.side, cfg)))


MEGATRON = register(Backend(
    kind="megatron", title="Megatron-LM (MindSpeed on an Ascend host)", config=MegatronConfig,
    roles=frozenset({"ascend", "cuda"}),
    formats=lambda cfg: SideFormats(log="megatron", loads=("megatron", "torch_dist"), saves="megatron"),
    render=_command, settings=_settings, dumps="msprobe",
))
