"""Preflight: prove, before anything runs, that both sides are configured to train the same thing the same way.

Every expensive misalignment in the seeds was a setting that differed between the two sides and could have been
read off the configurations: Megatron `--seed 42` against MindSpore's 1234 (a different sample order), GELU on
the GPU against SiLU on the NPU, `norm_topk_prob` off on one side while Megatron always renormalises, a warm-up
on one side only, a vocabulary padded differently. Preflight reads both sides' *effective* settings — the NPU
reload training's rendered YAML and the GPU training's Megatron argv, exactly as the runner launches them —
compares the alignment-critical ones (`rules.RULES`), and names, for every difference, both values and where
each came from.

```python
npu, gpu, data = render_sides(experiment, placement=placement)   # rendering only; no host is contacted
report = preflight(npu, gpu, data)                                # pure
if not report.ok: print(report.summary())
```

Modules: `values` (Value, DataFile, equality), `npu` (MindFormers / twin YAML reader), `gpu` (Megatron argv
reader), `megatron_lm` (Megatron-LM's argument parser as data: does `pretrain_gpt.py` accept the flags at all),
`megatron_combos` (what a version refuses after parsing: kernels the host lacks, evaluation, determinism),
`rules` (the table, `compare`, the report), `sides` (rendering an experiment's two sides), `gpu_host` (the one
check that contacts a host: is Megatron-LM where `gpu.entry` says, in the version and with the extensions
declared).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host, Inventory
from alignflow.config.placement import Placement, place
from alignflow.frameworks.megatron_lm import check_flags
from alignflow.preflight.gpu import gpu_settings
from alignflow.preflight.layout import batch_fits, checkpoint_loads, gpu_layout, npu_layout
from alignflow.preflight.megatron_combos import combination_problems
from alignflow.preflight.npu import npu_settings
from alignflow.preflight.rules import RULES, Finding, PreflightReport, Rule, compare
from alignflow.preflight.sides import SIDE_STEPS, DataBinding, GpuSide, NpuSide, render_sides
from alignflow.preflight.values import MISSING, DataFile, Value

__all__ = [
    "MISSING",
    "RULES",
    "DataBinding",
    "DataFile",
    "Finding",
    "GpuSide",
    "NpuSide",
    "PreflightReport",
    "Rule",
    "Value",
    "check_experiment",
    "preflight",
    "render_sides",
]


def preflight(npu: NpuSide, gpu: GpuSide, data: DataBinding, *,
              gpu_host_problems: list[str] | None = None) -> PreflightReport:
    """Compare the two rendered sides; pure: no file, host or clock is touched (`gpu_host_problems`: what
    `gpu_host.check_gpu_host` found, when the GPU host was probed)."""
    npu_s = npu_settings(npu.config, npu.kind, env=npu.env, env_source=npu.env_source, bind=data.bind)
    gpu_s = gpu_settings(gpu.argv, env=gpu.env, env_source=gpu.env_source, bind=data.bind,
                         megatron_version=gpu.megatron_version)
    npu_s["side.kind"] = Value(npu.kind, "npu.kind")
    gpu_s["side.kind"] = Value(gpu.kind, "gpu.kind")
    npu_s |= npu_layout(npu.config, npu.world, npu.world_source)
    gpu_s |= gpu_layout(gpu.argv, gpu.world, gpu.world_source)
    npu_s["parallel.batch_fits"], gpu_s["parallel.batch_fits"] = batch_fits(npu_s), batch_fits(gpu_s)
    if gpu.model is not None:
        gpu_s["parallel.loads_checkpoint"] = checkpoint_loads(gpu.argv, gpu.convert_argv, gpu.model)
    if gpu.kind == "megatron":
        accepted, why = check_flags(gpu.argv, gpu.megatron_version)
        gpu_s["gpu.flags"] = Value({True: "accepted", False: "refused", None: "not checked"}[accepted], why)
        ok, problems = combination_problems(gpu.argv, env=gpu.env, version=gpu.megatron_version,
                                            extensions=gpu.extensions)
        gpu_s["gpu.combination"] = Value({True: "accepted", False: "refused", None: "not checked"}[ok],
                                         "; ".join(problems) or f"megatron-core {gpu.megatron_version} on a host "
                                         f"with {', '.join(gpu.extensions or ()) or 'no TE, no Apex'}")
        if gpu_host_problems is None:
            gpu_s["gpu.host"] = Value("not checked", "the GPU host was not probed (alignflow preflight --check-hosts)")
        else:
            gpu_s["gpu.host"] = Value("refused" if gpu_host_problems else "ok",
                                      "; ".join(gpu_host_problems) or "Megatron-LM found at gpu.entry as declared")
    return compare(npu_s, gpu_s, sources={"npu": npu.source, "gpu": gpu.source})


def check_experiment(experiment: Experiment, *, inventory: Inventory | None = None,
                     placement: Placement | None = None, data_sha256: str | None = None,
                     transport_factory: Callable[[Host], Any] | None = None) -> PreflightReport:
    """Render `experiment`'s two sides and compare them (reads the MindFormers template). The sides' hosts come
    from `placement` (a run's), else are placed once from `inventory`. With hosts and a `transport_factory`
    (`alignflow.transport.open_transport`), the GPU host of a real Megatron side is probed for Megatron-LM at
    `gpu.entry`; otherwise no host is contacted."""
    if placement is None and inventory is not None:
        placement = place(experiment, inventory, steps=SIDE_STEPS)
    npu, gpu, data = render_sides(experiment, placement=placement, data_sha256=data_sha256)
    host_problems = None
    if placement is not None and transport_factory is not None:
        from alignflow.preflight.gpu_host import check_gpu_host

        host_problems = check_gpu_host(experiment, placement.host("gpu_train"), transport_factory)
    return preflight(npu, gpu, data, gpu_host_problems=host_problems)
