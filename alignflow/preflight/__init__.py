"""Preflight: prove, before anything runs, that both sides are configured to train the same thing the same way.

Every expensive misalignment in the seeds was a setting that differed between the two sides and could have been
read off the configurations: Megatron `--seed 42` against MindSpore's 1234 (a different sample order), GELU on
the GPU against SiLU on the NPU, `norm_topk_prob` off on one side while Megatron always renormalises, a warm-up
on one side only, a vocabulary padded differently. Preflight reads both sides' *effective* settings from what
each side's backend renders, exactly as the runner launches it — a MindFormers YAML, Megatron flags (on either side:
Megatron-LM on a GPU, MindSpeed on an NPU, the PyTorch twin), a `command` side's declared settings — compares the
alignment-critical ones by the same rules (`rules.RULES`) whatever the pair, and names, for every difference, both
values and where each came from.

```python
npu, gpu, data = render_sides(experiment, placement=placement)   # rendering only; no host is contacted
report = preflight(npu, gpu, data)                                # pure
if not report.ok: print(report.summary())
```

Modules: `values` (Value, DataFile, equality), `npu` (MindFormers / twin YAML reader), `gpu` (Megatron argv reader),
`declared` (a `command` side's declared settings), `megatron_lm` (Megatron-LM's argument parser as data: does
`pretrain_gpt.py` accept the flags at all), `megatron_combos` (what a version refuses after parsing: kernels the
host lacks, evaluation, determinism), `rules` (the table, `compare`, the report), `sides` (rendering an experiment's
two sides), `gpu_host` (the one check that contacts a host: is Megatron-LM where a Megatron side's `entry` says, in
the version and with the extensions declared).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from alignflow.backends.template import DeclaredSettings, MegatronArgs, MindFormersYaml
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host, Inventory
from alignflow.config.placement import Placement, place
from alignflow.frameworks.ascend import MINDSPEED_LLM_ADAPTOR, deterministic_flag
from alignflow.frameworks.megatron_lm import check_flags
from alignflow.pipeline import Side
from alignflow.preflight.declared import declared_settings
from alignflow.preflight.gpu import gpu_settings
from alignflow.preflight.layout import batch_fits, checkpoint_loads, gpu_layout, npu_layout
from alignflow.preflight.megatron_combos import combination_problems
from alignflow.preflight.npu import npu_settings
from alignflow.preflight.rules import RULES, Finding, PreflightReport, Rule, compare
from alignflow.preflight.sides import SIDE_STEPS, DataBinding, RenderedSide, render_sides
from alignflow.preflight.values import MISSING, DataFile, Value

__all__ = [
    "MISSING",
    "RULES",
    "DataBinding",
    "DataFile",
    "Finding",
    "PreflightReport",
    "RenderedSide",
    "Rule",
    "Value",
    "check_experiment",
    "preflight",
    "render_sides",
    "side_settings",
]

_CHECK = {True: "accepted", False: "refused", None: "not checked"}


def side_settings(side: RenderedSide, data: DataBinding, *, host_problems: list[str] | None = None
                  ) -> dict[str, Value]:
    """Every setting of one rendered side, read by the reader of what its backend renders (a MindFormers YAML,
    Megatron flags, declared settings), plus what its host's environment must hold for a deterministic run."""
    r = side.rendered

    def bind(path: str, _role: str) -> DataFile:  # a side's data path is looked up for the role it runs on
        return data.bind(path, side.role)

    s: dict[str, Value]
    if isinstance(r, MindFormersYaml):
        s = npu_settings(r.config, r.flavour, env=side.env, env_source=side.env_source, bind=bind)
        s |= npu_layout(r.config, side.world, side.world_source)
    elif isinstance(r, MegatronArgs):
        s = gpu_settings(r.argv, env=side.env, env_source=side.env_source, bind=bind,
                         megatron_version=r.megatron_version)
        s |= gpu_layout(r.argv, side.world, side.world_source)
        if side.model is not None:  # the checkpoint it is given, at its layout (`checkpoint_loads`)
            s["parallel.loads_checkpoint"] = checkpoint_loads(r.argv, side.convert_argv, side.model)
        if r.role == "ascend":  # MindSpeed's determinism switch stands for Megatron's --deterministic-mode there
            flag = deterministic_flag(r.adaptor or MINDSPEED_LLM_ADAPTOR)
            s["det.deterministic"] = Value(flag in r.argv, flag if flag in r.argv else
                                           f"{flag} absent (MindSpeed's switch on an NPU host)")
        if r.real:
            s |= _megatron_checks(side, r, host_problems)
    else:
        s = declared_settings(r, side_name=side.name, bind=bind)
    s["side.kind"] = Value(side.kind, f"{side.name}.kind")
    if "parallel.batch_fits" not in s:
        s["parallel.batch_fits"] = batch_fits(s)
    # determinism of the collectives is the host's: HCCL on an Ascend host, TE's on a GPU host (real frameworks
    # whose environment alignflow renders; a twin on a CPU and a command side's own script are not held to them)
    s.pop("det.hccl", None)
    s.pop("det.nvte", None)
    if side.real and not isinstance(r, DeclaredSettings):
        if side.role == "ascend":
            s["det.hccl"] = _env_flag(side, "HCCL_DETERMINISTIC", lambda v: v.lower() == "true")
        elif isinstance(r, MegatronArgs):
            s["det.nvte"] = _env_flag(side, "NVTE_ALLOW_NONDETERMINISTIC_ALGO", lambda v: v == "0")
    return s


def _env_flag(side: RenderedSide, name: str, ok: Any) -> Value:
    value = side.env.get(name)
    return Value(bool(ok(value)) if value is not None else False,
                 f"{name}={value} ({side.env_source})" if value is not None else f"{name} unset ({side.env_source})")


def _megatron_checks(side: RenderedSide, r: MegatronArgs, host_problems: list[str] | None) -> dict[str, Value]:
    """Does real Megatron-LM accept the command line, and megatron-core the combination, on this host?"""
    s: dict[str, Value] = {}
    if r.role == "ascend":  # MindSpeed adds its own flags to Megatron-LM's parser and its own kernels
        why = f"MindSpeed on an NPU host: its parser and kernels are not Megatron-LM {r.megatron_version}'s"
        s["megatron.flags"] = Value("not checked", why)
        s["megatron.combination"] = Value("not checked", why)
    else:
        accepted, why = check_flags(r.argv, r.megatron_version)
        s["megatron.flags"] = Value(_CHECK[accepted], why)
        ok, problems = combination_problems(r.argv, env=side.env, version=r.megatron_version,
                                            extensions=r.extensions, fixes=[f.split("@")[0] for f in r.fixes])
        s["megatron.combination"] = Value(_CHECK[ok], "; ".join(problems) or f"megatron-core {r.megatron_version} "
                                          f"on a host with {', '.join(r.extensions or ()) or 'no TE, no Apex'}")
    # a fixed Megatron is an input of the alignment like any other: name each fix and its fingerprint
    s["megatron.fixes"] = Value(", ".join(r.fixes) or "none", "declared Megatron fixes the launcher runs before "
                                "the entry (alignflow.frameworks.megatron_fixes)")
    if host_problems is None:
        s["megatron.host"] = Value("not checked", f"the {side.name} host was not probed (alignflow preflight "
                                   "--check-hosts)")
    else:
        s["megatron.host"] = Value("refused" if host_problems else "ok",
                                   "; ".join(host_problems) or f"Megatron-LM found at {side.name}.entry as declared")
    return s


def preflight(npu: RenderedSide, gpu: RenderedSide, data: DataBinding, *,
              host_problems: Mapping[Side, list[str]] | None = None) -> PreflightReport:
    """Compare the two rendered sides; pure: no file, host or clock is touched (`host_problems`: what
    `gpu_host.check_megatron_hosts` found on each probed side's host, when they were probed)."""
    probed = host_problems or {}
    npu_s = side_settings(npu, data, host_problems=probed.get(npu.name))
    gpu_s = side_settings(gpu, data, host_problems=probed.get(gpu.name))
    return compare(npu_s, gpu_s, sources={"npu": npu.source, "gpu": gpu.source})


def check_experiment(experiment: Experiment, *, inventory: Inventory | None = None,
                     placement: Placement | None = None, data_sha256: str | None = None,
                     transport_factory: Callable[[Host], Any] | None = None,
                     probe_sides: Collection[Side] | None = None) -> PreflightReport:
    """Render `experiment`'s two sides and compare them (reads a MindFormers template). The sides' hosts come from
    `placement` (a run's), else are placed once from `inventory`. With hosts and a `transport_factory`
    (`alignflow.transport.open_transport`), the host of each real Megatron side (of `probe_sides`, default both) is
    probed for Megatron-LM at its entry; otherwise no host is contacted."""
    if placement is None and inventory is not None:
        placement = place(experiment, inventory, steps=SIDE_STEPS)
    npu, gpu, data = render_sides(experiment, placement=placement, data_sha256=data_sha256)
    host_problems = None
    if placement is not None and transport_factory is not None:
        from alignflow.preflight.gpu_host import check_megatron_hosts

        host_problems = check_megatron_hosts(experiment, placement, transport_factory, sides=probe_sides)
    return preflight(npu, gpu, data, host_problems=host_problems)
