"""What a backend renders: a host-independent command template for one training (or conversion) of one side, and
the settings preflight reads back from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from alignflow.logs.formats import LogFormatSpec
from alignflow.pipeline import Role, Side

if TYPE_CHECKING:
    from alignflow.backends.launch import Layout

@dataclass(frozen=True, slots=True)
class TrainSpec:
    """What one training must do; paths are placeholders."""

    step: str
    side: Side
    steps: int
    data: str  # e.g. "{in:data}"
    data_sha256: str
    load: str | None  # e.g. "{in:bf16_ckpt}"; None = random initialisation (the base training)
    save: str | None  # e.g. "{out}/checkpoint"; None = do not save
    layout: Layout | None = None  # processes and nodes on the step's host; None: the experiment's, on one node
    role: Role | None = None  # the host's role (ascend: an NPU, cuda: a GPU); None: the side's own role


@dataclass(frozen=True, slots=True)
class CommandTemplate:
    """A rendered training command, before host paths are filled in."""

    argv: tuple[str, ...]
    log_format: str | LogFormatSpec  # a registered format's name (alignflow.logs.formats), or a declared one
    code_version: str
    files: dict[str, str] = field(default_factory=dict)  # path relative to {out} -> text
    env: dict[str, str] = field(default_factory=dict)
    log: str = "stdout"  # "stdout" or a path relative to {out}
    checkpoint: str | None = None  # path relative to {out} of the checkpoint the training saves
    required_lines: tuple[str, ...] = ()  # substrings a valid log contains (e.g. a successful load)
    code_repo: str | None = None  # host repo (hosts.yaml `repos`) whose commit versions this command
    # files of `files` that change the framework's code (declared Megatron fixes): recorded with the step as inputs,
    # by sha256, under the name given (they are shown with the run's fingerprints)
    code_files: dict[str, str] = field(default_factory=dict)  # input name -> path in `files`


@dataclass(frozen=True, slots=True)
class MegatronArgs:
    """A side's settings as Megatron's `pretrain_gpt.py` flags (launcher and entry stripped)."""

    argv: tuple[str, ...]
    megatron_version: str
    extensions: tuple[str, ...] | None  # what the host has besides PyTorch (None: not known)
    real: bool  # real Megatron-LM / MindSpeed: its parser and megatron-core's refusals apply (the twin mimics)
    entry: str | None = None  # pretrain_gpt.py on the host (real only): what `preflight --check-hosts` looks for
    role: Role = "cuda"  # ascend: MindSpeed on an NPU host
    adaptor: str | None = None  # the module imported before Megatron (None on an NPU host: the entry's own)
    fixes: tuple[str, ...] = ()  # declared Megatron fixes the launcher runs first, `name@sha256[:12]`


@dataclass(frozen=True, slots=True)
class MindFormersYaml:
    """A side's settings as a MindFormers YAML (real MindFormers, or the MindSpore twin's)."""

    config: Mapping[str, Any]
    flavour: Literal["mindformers", "twin"]
    template: str  # where the YAML came from


@dataclass(frozen=True, slots=True)
class DeclaredSettings:
    """A side's settings as its experiment section declares them (a `command` trainer alignflow cannot read)."""

    values: Mapping[str, tuple[Any, str]]  # preflight's setting name -> (value, where it was declared)
    source: str


RenderedSettings = MegatronArgs | MindFormersYaml | DeclaredSettings
"""What preflight reads a side's effective settings from (`alignflow.preflight` has one reader per kind)."""
