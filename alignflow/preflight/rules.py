"""The alignment-critical settings as a table, and the pure comparison of the two sides over it.

Each row names a setting the readers produce, whether the two sides must agree, and the value each side must
have regardless of the other (dropout 0, deterministic on). Rows that only one framework's reader produces (the
MindFormers dataloader's second shuffle, Megatron's `--dataloader-type`, Megatron-LM's parser, the host's HCCL or TE
determinism) are checked on whichever side reports them (`per_side`), so any pair of backends is compared by the
same table. Rows that only make sense for one kind of model (MoE rows need experts on both sides; when only one side
has them, the expert-count row says so once instead of every MoE row) carry a condition. A row a side cannot be read
for and does not declare (a `command` side) is `unchecked`, never `ok`. The comments cite the seed or reference
section that made each row necessary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from alignflow.pipeline import side
from alignflow.preflight.values import MISSING, Settings, Value, display, jsonable, same

Side = Literal["npu", "gpu"]
Status = Literal["ok", "mismatch", "unchecked"]
Cond = Callable[[Settings, Settings], bool]
_NO = object()


def _both_have(name: str) -> Cond:
    def cond(npu: Settings, gpu: Settings) -> bool:
        return all(s.get(name, Value(0, "")).value not in (0, False, None, MISSING, ()) for s in (npu, gpu))

    return cond


def _both_known(name: str) -> Cond:
    def cond(npu: Settings, gpu: Settings) -> bool:
        return all(not s.get(name, Value(MISSING, "")).missing for s in (npu, gpu))

    return cond


def _decays(npu: Settings, gpu: Settings) -> bool:
    return any(s.get("opt.decay_style", Value(None, "")).value not in ("constant", None, MISSING) for s in (npu, gpu))


def _expert_bias(npu: Settings, gpu: Settings) -> bool:
    return bool(npu.get("moe.expert_bias", Value(False, "")).value) and bool(
        gpu.get("moe.expert_bias", Value(False, "")).value)


@dataclass(frozen=True, slots=True)
class Rule:
    """One alignment-critical setting."""

    setting: str
    label: str
    group: str
    agree: bool = True  # both sides must hold the same value
    required: Any = _NO  # each side in `sides` must hold this value (or one of a frozenset of values)
    sides: tuple[Side, ...] = ("npu", "gpu")
    when: Cond | None = None
    why: str = ""
    per_side: bool = False  # checked on each side whose reader produces it (a framework's own setting)


MOE = _both_have("moe.num_experts")
MTP = _both_have("mtp.num_layers")
GDN = _both_have("gdn.freq")
MLA = _both_have("mla.enabled")
DSA = _both_have("dsa.enabled")

RULES: tuple[Rule, ...] = (
    # data: same file, same order (docs/seeds.md#data-order: Megatron --seed 42 vs MindSpore 1234 = different samples)
    Rule("data.file", "data file", "data", why="both sides must read the same bytes"),
    # a twin side checks the sha256 it is given; real Megatron-LM checks none (the runner verifies the staged copy)
    Rule("data.sha256", "data fingerprint (twin)", "data", when=lambda n, g: "data.sha256" in n and "data.sha256" in g),
    Rule("data.seed", "data order seed", "data", why="GPTDataset shuffle index (docs/seeds.md#data-order)"),
    Rule("data.samples", "samples in the dataset index", "data", why="the shuffle index depends on num_samples"),
    Rule("data.split", "train/valid/test split", "data"),
    Rule("data.seq_length", "dataset sequence length", "data"),
    Rule("data.eod", "end-of-document id", "data", when=_both_known("data.eod"),
         why="NullTokenizer's EOD moved in megatron-core 0.18; it decides --eod-mask-loss and --reset-*"),
    Rule("data.shuffle", "second shuffle of the MindFormers dataloader", "data", agree=False, required=False,
         per_side=True, why="the order must come from the GPTDataset index alone"),
    Rule("data.dataloader_type", "Megatron dataloader type", "data", agree=False, required="single", per_side=True,
         why="cyclic adds a randperm per epoch (docs/seeds.md#data-order)"),
    Rule("train.init_seed", "initialisation seed", "training"),
    # optimisation
    Rule("train.steps", "training steps", "training"),
    Rule("train.micro_batch_size", "micro batch size", "training"),
    Rule("train.global_batch_size", "global batch size", "training"),
    Rule("train.clip_grad", "gradient clipping (max norm)", "training"),
    # parallel layout: the sides may differ, but each must consume the whole global batch per step
    Rule("parallel.world", "processes of the training", "parallel", agree=False),
    Rule("parallel.tp", "tensor parallel size", "parallel", agree=False),
    Rule("parallel.pp", "pipeline stages", "parallel", agree=False),
    Rule("parallel.ep", "expert parallel size", "parallel", agree=False),
    Rule("parallel.dp", "data parallel size", "parallel", agree=False),
    Rule("parallel.batch_fits", "global batch = micro batch x dp x accumulation", "parallel", agree=False,
         required=True, why="each step must consume the same global batch, in the same order, on both sides"),
    Rule("parallel.loads_checkpoint", "the layout loads the checkpoint it is given", "parallel", agree=False,
         required=True, per_side=True,
         why="legacy files load only at their own tp/pp/ep; megatron-core must build the model at the layout"),
    Rule("load.weights_only", "weights-only load (schedule and data restart at step 0)", "training", agree=False,
         required=True, why="MindFormers no_load_optim = Megatron --finetune --no-load-optim"),
    Rule("opt.type", "optimizer", "optimizer", why="Megatron's adam is AdamW (decoupled weight decay)"),
    Rule("opt.lr", "learning rate", "optimizer"),
    Rule("opt.warmup_steps", "warm-up steps", "optimizer",
         why="docs/seeds.md#moe-router-renormalisation-norm_topk_prob: warmup_ratio 0.01 x 1000 = 10"),
    Rule("opt.warmup_init", "warm-up initial learning rate", "optimizer"),
    Rule("opt.decay_style", "learning-rate decay style", "optimizer"),
    Rule("opt.min_lr", "minimum learning rate", "optimizer", when=_decays),
    Rule("opt.decay_steps", "decay steps", "optimizer", when=_decays),
    Rule("opt.weight_decay", "weight decay", "optimizer"),
    Rule("opt.beta1", "Adam beta1", "optimizer"),
    Rule("opt.beta2", "Adam beta2", "optimizer", why="Megatron's default is 0.999, MindFormers' 0.95"),
    Rule("opt.eps", "Adam epsilon", "optimizer"),
    # model shape
    Rule("model.num_layers", "layers", "model"),
    Rule("model.hidden_size", "hidden size", "model"),
    Rule("model.ffn_hidden_size", "dense FFN size", "model"),
    Rule("model.num_attention_heads", "attention heads", "model"),
    Rule("model.num_query_groups", "KV groups", "model"),
    Rule("model.head_dim", "head dim (kv channels)", "model", when=lambda n, g: not MLA(n, g)),
    Rule("model.seq_length", "sequence length", "model"),
    Rule("model.vocab_size", "vocabulary (NPU) vs Megatron's padded vocabulary", "model",
         why="padded rows enter the softmax and change the loss "
             "(docs/megatron.md#vocabulary-padding-and-nulltokenizer)"),
    Rule("model.untie_embeddings", "separate output layer", "model"),
    Rule("model.position_embedding", "position embedding", "model"),
    Rule("model.rotary_base", "RoPE base", "model"),
    Rule("model.rotary_percent", "rotary percent (partial RoPE)", "model"),
    Rule("model.normalization", "norm type", "model"),
    Rule("model.norm_epsilon", "norm epsilon", "model"),
    Rule("model.zero_centered_gamma", "zero-centred gamma", "model",
         why="docs/seeds.md#common-mapping-rules: standard gamma both sides"),
    Rule("model.activation", "activation", "model",
         why="docs/seeds.md#gpu-activation-gelu-instead-of-silu: GELU on the GPU vs SiLU on the NPU"),
    Rule("model.gated_linear_unit", "gated linear unit (GLU)", "model"),
    Rule("model.add_bias_linear", "linear biases", "model"),
    Rule("model.qk_layernorm", "q/k layernorm", "model"),
    Rule("model.attention_output_gate", "attention output gate", "model"),
    Rule("model.hidden_dropout", "hidden dropout", "model", required=0.0, why="dropout must be 0 on both sides"),
    Rule("model.attention_dropout", "attention dropout", "model", required=0.0, why="dropout must be 0 on both sides"),
    Rule("model.precision_bf16", "bf16 compute", "model"),
    # MoE (docs/seeds.md#gpu-training-flags, docs/seeds.md#moe-router-renormalisation-norm_topk_prob;
    # docs/seeds.md#glm-52-problems-and-fixes)
    Rule("moe.num_experts", "routed experts", "moe"),
    Rule("moe.topk", "experts per token (top-k)", "moe", when=MOE),
    Rule("moe.ffn_hidden_size", "routed expert FFN size", "moe", when=MOE),
    Rule("moe.layer_pattern", "MoE layers (1) and dense layers (0)", "moe", when=MOE),
    Rule("moe.shared_expert_size", "shared expert FFN size", "moe", when=MOE),
    Rule("moe.shared_expert_gate", "shared expert gate", "moe", when=MOE,
         why="MindSpore has shared_experts_gate: Megatron needs --moe-shared-expert-gate"),
    Rule("moe.score_function", "router score function", "moe", when=MOE),
    Rule("moe.renormalize", "top-k renormalisation", "moe", when=MOE,
         why="docs/seeds.md#moe-router-renormalisation-norm_topk_prob: norm_topk_prob False halves the expert weights"),
    Rule("moe.topk_scaling", "routed scaling factor", "moe", when=MOE),
    Rule("moe.load_balancing", "load-balancing loss type", "moe", when=MOE),
    Rule("moe.aux_loss_coeff", "aux-loss coefficient", "moe", when=MOE),
    Rule("moe.expert_bias", "aux-loss-free expert bias", "moe", when=MOE),
    Rule("moe.bias_update_rate", "expert-bias update rate", "moe", when=_expert_bias),
    # MTP
    Rule("mtp.num_layers", "MTP layers", "mtp"),
    Rule("mtp.loss_scale", "MTP loss scale", "mtp", when=MTP),
    # attention variants
    Rule("gdn.freq", "GatedDeltaNet: every N-th layer full attention", "attention"),
    *(Rule(f"gdn.{n}", f"GatedDeltaNet {n.replace('_', ' ')}", "attention", when=GDN)
      for n in ("conv_kernel_dim", "key_head_dim", "value_head_dim", "num_key_heads", "num_value_heads")),
    Rule("mla.enabled", "multi-latent attention", "attention"),
    *(Rule(f"mla.{n}", f"MLA {n.replace('_', ' ')}", "attention", when=MLA)
      for n in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")),
    Rule("dsa.enabled", "sparse attention indexer (DSA)", "attention"),
    *(Rule(f"dsa.{n}", f"DSA indexer {n.replace('_', ' ')}", "attention", when=DSA)
      for n in ("n_heads", "head_dim", "topk")),
    # determinism (docs/seeds.md#sparse-dsa-determinism; docs/mindformers.md#seeds-and-determinism,
    # docs/megatron.md#determinism-and-flags)
    Rule("det.deterministic", "deterministic mode", "determinism", required=True,
         why="MindFormers training.deterministic, Megatron --deterministic-mode"),
    Rule("det.hccl", "HCCL_DETERMINISTIC=true on an Ascend host", "determinism", agree=False, required=True,
         per_side=True),
    Rule("det.nvte", "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 on a GPU host", "determinism", agree=False, required=True,
         per_side=True),
    # the command line itself: a misspelt flag stops pretrain_gpt.py at argparse, hours into the experiment
    Rule("megatron.flags", "pretrain_gpt.py accepts every flag", "command line", agree=False,
         required=frozenset({"accepted", "not checked"}), per_side=True,
         why="checked against Megatron-LM's parser for the side's megatron_version"),
    Rule("megatron.combination", "megatron-core accepts the combination (kernels, evaluation, determinism)",
         "command line", agree=False, required=frozenset({"accepted", "not checked"}), per_side=True,
         why="what validate_args and the layers refuse for the side's megatron_version on a host with its "
         "extensions"),
    Rule("megatron.fixes", "declared Megatron fixes (name@sha256)", "command line", agree=False, per_side=True,
         why="a changed Megatron is an input of the alignment: the run records each fix's fingerprint"),
    Rule("attention.backend", "attention kernels (--attention-backend)", "attention", agree=False, per_side=True,
         why="fused, flash and unfused attention round differently; a TE x cuDNN pair known to fail in fused "
         "attention is named by preflight --check-hosts"),
    Rule("megatron.host", "Megatron-LM at the side's entry on its host", "command line", agree=False,
         required=frozenset({"ok", "not checked"}), per_side=True,
         why="a host without it fails the training after the base training and the conversions"),
)


def _meets(value: Any, required: Any) -> bool:
    """`required` is one value, or a frozenset of the values allowed."""
    return value in required if isinstance(required, frozenset) else same(value, required)


def _shown(required: Any) -> str:
    return " or ".join(sorted(map(display, required))) if isinstance(required, frozenset) else display(required)


@dataclass(frozen=True, slots=True)
class Finding:
    """One checked setting: both sides' values with their sources, and what is wrong, if anything."""

    setting: str
    label: str
    group: str
    status: Status
    npu: Value | None
    gpu: Value | None
    problems: tuple[str, ...] = ()

    def line(self) -> str:
        sides = " vs ".join(f"{side(name).label} {v.show()}" for name, v in (("npu", self.npu), ("gpu", self.gpu))
                            if v)
        text = f"{self.label}: {sides}"
        return f"{text} — {'; '.join(self.problems)}" if self.problems else text

    def to_dict(self) -> dict[str, Any]:
        def side(v: Value | None) -> dict[str, Any] | None:
            return None if v is None else {"value": jsonable(v.value), "shown": display(v.value), "source": v.source}

        return {"setting": self.setting, "label": self.label, "group": self.group, "status": self.status,
                "npu": side(self.npu), "gpu": side(self.gpu), "problems": list(self.problems)}


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """Every finding of one preflight; `ok` when none is a mismatch."""

    findings: tuple[Finding, ...]
    sources: Mapping[str, str] = field(default_factory=dict)  # side -> where its configuration came from

    @property
    def mismatches(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "mismatch")

    @property
    def unchecked(self) -> tuple[Finding, ...]:
        """Rows a side could not be read for and does not declare (compared by neither value)."""
        return tuple(f for f in self.findings if f.status == "unchecked")

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        """One paragraph: the verdict and each mismatch with both values and where each came from."""
        unchecked = self.unchecked
        checked = len(self.findings) - len(unchecked)
        note = (f"; {len(unchecked)} not checked (not declared: "
                f"{', '.join(f.setting for f in unchecked[:6])}{' ...' if len(unchecked) > 6 else ''})"
                if unchecked else "")
        if self.ok:
            return f"preflight: {checked} alignment-critical settings agree{note}"
        lines = [f"preflight: {len(self.mismatches)} of {checked} alignment-critical settings differ "
                 f"between the NPU and the GPU side{note}:"]
        lines += [f"  - {f.line()}" for f in self.mismatches]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checked": len(self.findings) - len(self.unchecked),
                "unchecked": len(self.unchecked), "mismatches": len(self.mismatches),
                "sources": dict(self.sources), "findings": [f.to_dict() for f in self.findings]}


def compare(npu: Settings, gpu: Settings, *, rules: tuple[Rule, ...] = RULES,
            sources: Mapping[str, str] | None = None) -> PreflightReport:
    """Check every rule that applies; pure (no I/O): the same settings always give the same report."""
    findings = []
    for rule in rules:
        if rule.when is not None and not rule.when(npu, gpu):
            continue
        names = [name for name, s in (("npu", npu), ("gpu", gpu)) if rule.setting in s] if rule.per_side else \
            list(rule.sides)
        if not names:
            continue
        values = {name: (npu if name == "npu" else gpu).get(rule.setting, Value(MISSING, "not read"))
                  for name in names}
        if any(v.undeclared for v in values.values()):
            findings.append(Finding(rule.setting, rule.label, rule.group, "unchecked", values.get("npu"),
                                    values.get("gpu"), tuple(f"{side(name).label}: {v.source}" for name, v in
                                                             values.items() if v.undeclared)))
            continue
        problems: list[str] = []
        for name, value in values.items():
            if value.missing:
                problems.append(f"{side(name).label}: {value.source}")
            elif rule.required is not _NO and not _meets(value.value, rule.required):
                problems.append(f"{side(name).label} must be {_shown(rule.required)}")
        if rule.agree and len(values) == 2 and not any(v.missing for v in values.values()) and not same(
                values["npu"].value, values["gpu"].value):
            problems.insert(0, "the two sides differ" + (f" ({rule.why})" if rule.why else ""))
        findings.append(Finding(rule.setting, rule.label, rule.group, "mismatch" if problems else "ok",
                                values.get("npu"), values.get("gpu"), tuple(problems)))
    return PreflightReport(tuple(findings), dict(sources or {}))
