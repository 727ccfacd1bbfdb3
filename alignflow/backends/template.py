"""What a backend renders: a host-independent command template for one training (or conversion) of one side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from alignflow.backends.launch import Layout

Side = Literal["npu", "gpu"]
LogFormat = Literal["mindformers", "megatron"]


@dataclass(frozen=True, slots=True)
class TrainSpec:
    """What one training must do; paths are placeholders."""

    step: str
    side: Side
    steps: int
    data: str  # e.g. "{in:data}"
    data_sha256: str
    load: str | None  # e.g. "{in:bf16_ckpt}"; None = random initialisation (the NPU base training)
    save: str | None  # e.g. "{out}/checkpoint"; None = do not save
    layout: Layout | None = None  # processes and nodes on the step's host; None: the experiment's, on one node


@dataclass(frozen=True, slots=True)
class CommandTemplate:
    """A rendered training command, before host paths are filled in."""

    argv: tuple[str, ...]
    log_format: LogFormat
    code_version: str
    files: dict[str, str] = field(default_factory=dict)  # path relative to {out} -> text
    env: dict[str, str] = field(default_factory=dict)
    log: str = "stdout"  # "stdout" or a path relative to {out}
    checkpoint: str | None = None  # path relative to {out} of the checkpoint the training saves
    required_lines: tuple[str, ...] = ()  # substrings a valid log contains (e.g. a successful load)
    code_repo: str | None = None  # host repo (hosts.yaml `repos`) whose commit versions this command
