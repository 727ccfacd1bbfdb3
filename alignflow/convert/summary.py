"""What a conversion did: the summary every converter returns, and the progress callback it reports through."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from alignflow.errors import ConversionError
from alignflow.staging import staged_dir

log = logging.getLogger(__name__)

# progress(done_bytes, total_bytes): called after each tensor (or rule) with the input bytes processed so far.
ProgressFn = Callable[[int, int], None]
# Megatron's `--ckpt-format`: the legacy pickles (one per rank) or the distributed checkpoint.
CkptFormat = Literal["torch", "torch_dist"]


@dataclass(frozen=True, slots=True)
class ConversionSummary:
    """The record of one conversion; `to_json()` is what `alignflow convert ... --json` prints and the store keeps."""

    kind: Literal["bf16", "megatron", "mindformers", "torch_dist", "hf", "dcp"]
    source: str
    destination: str
    iteration: int
    tensors: int  # tensors written (Megatron `_extra_state` placeholders not counted)
    bytes: int  # tensor payload bytes written
    seconds: float
    output_files: tuple[str, ...]  # relative to destination
    dropped: tuple[str, ...] = ()  # source keys left out on purpose (optimizer state, counters, spec `ignore`)
    dtypes: tuple[tuple[str, int], ...] = ()  # dtype -> number of tensors written
    spec: str | None = None
    flavor: str | None = None
    megatron_version: str | None = None
    extra_state_keys: int = 0
    notes: tuple[str, ...] = field(default=())
    ckpt_format: CkptFormat | None = None  # Megatron side: which `--ckpt-format` was written or read
    parallel: tuple[tuple[str, int], ...] = ()  # Megatron side: the tp / pp / ep the files are laid out for

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["dtypes"] = dict(self.dtypes)
        out["parallel"] = dict(self.parallel)
        for key in ("output_files", "dropped", "notes"):
            out[key] = list(out[key])
        return out


def dtype_counts(dtypes: list[str]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for d in dtypes:
        counts[d] = counts.get(d, 0) + 1
    return tuple(sorted(counts.items()))


def staged_output(dst: Path, *, purpose: str = "conversion") -> AbstractContextManager[Path]:
    """A staging directory next to `dst` that becomes `dst` only if the block finishes: `alignflow.staging`.

    Conversions leave nothing behind on failure and never overwrite (issue 4); what a killed conversion leaves is
    removed by the next write beside it or by `alignflow gc` once its process is known dead (issues 16, 33).
    """
    return staged_dir(dst, purpose=purpose,
                      refuse=lambda message: ConversionError([message], header="refusing to overwrite"))
