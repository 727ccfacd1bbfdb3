"""Checkpoint conversion: steps 2 and 3 of the pipeline, declarative and fail-closed (issue 4).

```
convert_bf16(src, dst)                          MindFormers checkpoint -> bf16 MindFormers checkpoint
convert_to_megatron(src, dst, spec=...)         bf16 MindFormers checkpoint -> Megatron legacy checkpoint
convert_to_mindformers(src, dst, spec=...)      Megatron legacy checkpoint -> bf16 MindFormers checkpoint
list_specs() / load_spec(name)                  the packaged specs (alignflow/convert/specs/*.yaml)
```

Modules: `bf16` (step 2, drop/keep table), `engine` (step 3 and reverse), `spec` / `registry` (spec data and
loading), `plan` (a spec expanded for one model), `ops` (invertible tensor ops), `dims` (named dimensions and
predicates), `mindformers` / `megatron` (checkpoint layouts), `tensor_io` (streaming safetensors),
`summary` (the returned record, staged output directories).

Weight conversion is where alignment experiments go wrong silently (transposed experts, interleaved SwiGLU rows,
a missing router buffer, a renamed MTP prefix) and Megatron then trains from random tensors with exit code 0.
So every converter checks everything it can from the headers first and raises one `ConversionError` listing
every problem, and writes into a temporary directory that is renamed into place only at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alignflow.lazy import lazy_exports

if TYPE_CHECKING:
    from alignflow.convert.bf16 import convert_bf16
    from alignflow.convert.engine import convert_to_megatron, convert_to_mindformers
    from alignflow.convert.plan import Plan, build_plan
    from alignflow.convert.registry import SpecInfo, list_specs, load_spec
    from alignflow.convert.spec import Spec
    from alignflow.convert.summary import ConversionSummary, ProgressFn

# Imported on first use (PEP 562), so that the torch-free `alignflow.convert.layout` can be imported by the
# MindSpore twin and by preflight without pulling in torch through the engine.
_LAZY = {"convert_bf16": "bf16", "convert_to_megatron": "engine", "convert_to_mindformers": "engine",
         "Plan": "plan", "build_plan": "plan", "SpecInfo": "registry", "list_specs": "registry",
         "load_spec": "registry", "Spec": "spec", "ConversionSummary": "summary", "ProgressFn": "summary"}

__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "ConversionSummary",
    "Plan",
    "ProgressFn",
    "Spec",
    "SpecInfo",
    "build_plan",
    "convert_bf16",
    "convert_to_megatron",
    "convert_to_mindformers",
    "list_specs",
    "load_spec",
]


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
