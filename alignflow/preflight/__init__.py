"""Preflight: prove, before anything runs, that both sides are configured to train the same thing the same way.

Every expensive misalignment in the seeds was a setting that differed between the two sides and could have been
read off the configurations: Megatron `--seed 42` against MindSpore's 1234 (a different sample order), GELU on
the GPU against SiLU on the NPU, `norm_topk_prob` off on one side while Megatron always renormalises, a warm-up
on one side only, a vocabulary padded differently. Preflight reads both sides' *effective* settings — the NPU
reload training's rendered YAML and the GPU training's Megatron argv, exactly as the runner launches them —
compares the alignment-critical ones (`rules.RULES`), and names, for every difference, both values and where
each came from.

```python
npu, gpu, data = render_sides(experiment, inventory=inventory)   # rendering only; no host is contacted
report = preflight(npu, gpu, data)                                # pure
if not report.ok: print(report.summary())
```

Modules: `values` (Value, DataFile, equality), `npu` (MindFormers / twin YAML reader), `gpu` (Megatron argv
reader), `megatron_lm` (Megatron-LM's argument parser as data: does `pretrain_gpt.py` accept the flags at all),
`rules` (the table, `compare`, the report), `sides` (rendering an experiment's two sides).
"""

from __future__ import annotations

from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Inventory
from alignflow.preflight.gpu import gpu_settings
from alignflow.preflight.megatron_lm import check_flags
from alignflow.preflight.npu import npu_settings
from alignflow.preflight.rules import RULES, Finding, PreflightReport, Rule, compare
from alignflow.preflight.sides import DataBinding, GpuSide, NpuSide, render_sides
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


def preflight(npu: NpuSide, gpu: GpuSide, data: DataBinding) -> PreflightReport:
    """Compare the two rendered sides; pure: no file, host or clock is touched."""
    npu_s = npu_settings(npu.config, npu.kind, env=npu.env, env_source=npu.env_source, bind=data.bind)
    gpu_s = gpu_settings(gpu.argv, env=gpu.env, env_source=gpu.env_source, bind=data.bind)
    npu_s["side.kind"] = Value(npu.kind, "npu.kind")
    gpu_s["side.kind"] = Value(gpu.kind, "gpu.kind")
    if gpu.kind == "megatron":
        accepted, why = check_flags(gpu.argv, gpu.megatron_version)
        gpu_s["gpu.flags"] = Value({True: "accepted", False: "refused", None: "not checked"}[accepted], why)
    return compare(npu_s, gpu_s, sources={"npu": npu.source, "gpu": gpu.source})


def check_experiment(experiment: Experiment, *, inventory: Inventory | None = None,
                     data_sha256: str | None = None) -> PreflightReport:
    """Render `experiment`'s two sides and compare them (reads the MindFormers template; contacts no host)."""
    npu, gpu, data = render_sides(experiment, inventory=inventory, data_sha256=data_sha256)
    return preflight(npu, gpu, data)
