"""Bug-injection switches of the twin: the seeds' model and optimizer bugs, switched on for one side.

`alignflow diagnose` must name the module (or the optimizer) and the cause class of each bug the seeds spent
weeks on (issue 21). To prove it, a side of the twin can be told to reproduce one of them through the
environment of its training command — an experiment's `npu.env` / `gpu.env`, so the bug travels through the
same seams as every real setting:

    ALIGNFLOW_TWIN_INJECT="activation=gelu,rotary_base=1e6,norm_topk_prob=false,adam_eps=1e-6,bf16_writeback=true"

| switch | what the side then does | the seeds' bug |
|---|---|---|
| `activation=gelu` | GELU instead of SiLU inside every SwiGLU | Megatron without `--swiglu` after GLU |
| `rotary_base=<float>` | RoPE with another base | rope theta 1e4 vs 1e6 |
| `norm_topk_prob=false` | top-k routing probabilities not renormalised | a router without renorm |
| `adam_eps=<float>` | AdamW with another epsilon | optimizer hyper-parameters differ |
| `bf16_writeback=true/false` | parameters rounded (or not) to bf16 after each update | one-sided write-back |

Conversion bugs (an fc1 copied without de-interleave, a square expert matrix not transposed) are not switches:
they live in a checkpoint, and the tests write them there. Nothing here is read unless the variable is set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from alignflow.errors import ConfigError
from alignflow.twin.presets import TwinSpec
from alignflow.twin.schedule import OptimSettings

INJECT_ENV = "ALIGNFLOW_TWIN_INJECT"
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_ACTIVATIONS = ("silu", "gelu")


@dataclass(frozen=True, slots=True)
class Faults:
    """The injected bugs of one side (None = as configured)."""

    activation: str | None = None
    rotary_base: float | None = None
    norm_topk_prob: bool | None = None
    adam_eps: float | None = None
    bf16_writeback: bool | None = None

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in dataclasses.fields(self))

    def model(self, spec: TwinSpec) -> TwinSpec:
        """The model the side builds with these bugs."""
        changes: dict[str, object] = {}
        if self.activation is not None:
            changes["activation"] = self.activation
        if self.rotary_base is not None:
            changes["rotary_base"] = self.rotary_base
        if self.norm_topk_prob is not None and spec.moe is not None:
            changes["moe"] = dataclasses.replace(spec.moe, norm_topk_prob=self.norm_topk_prob)
        return dataclasses.replace(spec, **changes) if changes else spec  # type: ignore[arg-type]

    def optimizer(self, settings: OptimSettings) -> OptimSettings:
        """The optimizer settings the side uses with these bugs."""
        changes: dict[str, object] = {}
        if self.adam_eps is not None:
            changes["eps"] = self.adam_eps
        if self.bf16_writeback is not None:
            changes["bf16_params"] = self.bf16_writeback
        return dataclasses.replace(settings, **changes) if changes else settings  # type: ignore[arg-type]

    def describe(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if getattr(self, f.name) is not None)


def optimizer_json(settings: OptimSettings) -> dict[str, object]:
    """The AdamW settings a side used, as its dump records them (diagnose shows the ones that differ)."""
    return {"eps": settings.eps, "beta1": settings.beta1, "beta2": settings.beta2,
            "weight_decay": settings.weight_decay, "clip_grad": settings.clip_grad, "bf16_params": settings.bf16_params}


def parse_faults(text: str, *, where: str = INJECT_ENV) -> Faults:
    """`key=value,...` -> `Faults`; an unknown switch or a bad value is a `ConfigError` naming it."""
    values: dict[str, object] = {}
    names = [f.name for f in dataclasses.fields(Faults)]
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or key not in names:
            raise ConfigError(f"{where}: {item!r}: expected one of {', '.join(n + '=...' for n in names)}")
        try:
            if key == "activation":
                if raw not in _ACTIVATIONS:
                    raise ValueError(f"one of {', '.join(_ACTIVATIONS)}")
                values[key] = raw
            elif key in ("norm_topk_prob", "bf16_writeback"):
                values[key] = _BOOLS[raw.lower()]
            else:
                value = float(raw)
                if not value > 0:
                    raise ValueError("a positive number")
                values[key] = value
        except (KeyError, ValueError) as exc:
            want = exc.args[0] if isinstance(exc, ValueError) and exc.args else "true or false"
            raise ConfigError(f"{where}: {key}={raw!r}: expected {want}") from None
    return Faults(**values)  # type: ignore[arg-type]


def faults_from_env(env: Mapping[str, str]) -> Faults:
    """The faults the environment of a training process asks for (none when the variable is unset)."""
    return parse_faults(env.get(INJECT_ENV, ""))
