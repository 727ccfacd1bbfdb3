"""Megatron legacy (`--ckpt-format torch`) checkpoints for the PyTorch twin: read, load like Megatron, write.

Layout (docs/megatron.md#legacy-checkpoint-layout): `<dir>/latest_checkpointed_iteration.txt` holding `N` or `release`,
and `<dir>/iter_%07d/mp_rank_00/model_optim_rng.pt` (or `release/mp_rank_00/...`) =
`{'model': state_dict, 'checkpoint_version': 3.0, 'iteration': N}`, read with `torch.load(weights_only=True)`.

Loading behaves like Megatron where alignflow's sentinels must see it: a checkpoint whose names do not match the
model makes the strict load fail, the twin falls back to a non-strict load, prints `load_return: None` and
trains on (docs/megatron.md#strict-load-and-the-silent-fallback) — the missing tensors keep their random initialisation,
exactly the silent failure
alignflow has to catch. A shape mismatch is fatal, as in Megatron. Unlike Megatron, a missing directory or
tracker is an error, never a silent random initialisation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alignflow.convert.layout import CHECKPOINT_VERSION, MEGATRON_FILE_NAME, TRACKER, checkpoint_path, write_atomic
from alignflow.convert.sharding import RankLayout
from alignflow.errors import ConfigError
from alignflow.twin import logformats as fmt
from alignflow.twin.flavours import KeyLayout

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What a load found: the checkpoint's iteration and everything that did not match."""

    iteration: int
    release: bool
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    optimizer: dict[str, Any] | None

    @property
    def strict(self) -> bool:
        return not self.missing and not self.unexpected


def read_tracker(load_dir: Path, *, where: str) -> tuple[int, bool]:
    if not load_dir.is_dir():
        raise ConfigError(f"{where}: --load {str(load_dir)!r} is not a directory; the twin never starts from a "
                          "random initialisation when a checkpoint was asked for")
    tracker = load_dir / TRACKER
    if not tracker.is_file():
        raise ConfigError(f"{where}: --load {str(load_dir)!r} has no {TRACKER}; point --load at a Megatron "
                          "legacy checkpoint directory (tracker + iter_XXXXXXX/mp_rank_00/model_optim_rng.pt)")
    text = tracker.read_text().strip()
    if text == "release":
        return 0, True
    try:
        return int(text), False
    except ValueError:
        raise ConfigError(f"{where}: invalid metadata file {str(tracker)!r}: {text!r} is neither an iteration "
                          "nor 'release'") from None


def checkpoint_file(root: Path, iteration: int, *, release: bool = False, rank_dir: str = "mp_rank_00") -> Path:
    rel = checkpoint_path(None if release else iteration)
    return root / rel.replace("mp_rank_00", rank_dir, 1)


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Which rank's files a process reads and writes: its tensor-parallel rank and pipeline stage, of how many."""

    tp: int = 0
    pp: int = 0
    tp_size: int = 1
    pp_size: int = 1

    @property
    def dir_name(self) -> str:
        """Megatron-LM's `mp_rank_TT[_PPP]` (`get_checkpoint_name`)."""
        return f"mp_rank_{self.tp:02d}" + (f"_{self.pp:03d}" if self.pp_size > 1 else "")


def load_checkpoint(model: nn.Module, load_dir: Path, layout: KeyLayout, *, finetune: bool, where: str,
                    place: RankPlace = RankPlace(), ckpt_format: str = "torch",
                    dist_layout: Callable[[], RankLayout] | None = None) -> LoadResult:
    """Load `load_dir` into `model` the way Megatron does, printing Megatron's lines through `log`.

    The checkpoint's format is read from the directory, as Megatron-LM reads it (`_get_checkpoint_format`): a
    `dist_checkpointing` directory is torch_dist - which a `--ckpt-format torch` run refuses, as Megatron-LM does
    -, else this rank's legacy file `mp_rank_TT[_PPP]/model_optim_rng.pt`. A torch_dist load reads this rank's
    pieces of the global tensors (`dist_layout`: megatron-core's layout of this rank) and, like megatron-core's,
    fails on a tensor the checkpoint lacks (there is no silent fallback there)."""
    iteration, release = read_tracker(load_dir, where=where)
    directory = checkpoint_file(load_dir, iteration, release=release).parent.parent
    distributed = (directory / "metadata.json").is_file()
    log.info(fmt.megatron_loading_line(str(load_dir), iteration, release=release, distributed=distributed))
    if distributed:
        if ckpt_format != "torch_dist":
            raise ConfigError(f"{where}: Detected load from a distributed checkpoint, but neither --use-dist-ckpt nor "
                              "--auto-detect-ckpt-format is set (pass --ckpt-format torch_dist)")
        assert dist_layout is not None, "a torch_dist load needs this rank's layout"
        return _load_distributed(model, load_dir, directory, layout, dist_layout(), finetune=finetune, where=where,
                                 place=place, iteration=iteration, release=release)
    path = directory / place.dir_name / MEGATRON_FILE_NAME
    if not path.is_file():
        raise ConfigError(f"{where}: the tracker names iteration {iteration}, but {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle / runtime / OS errors alike
        log.info("could not load the checkpoint")
        log.info(str(exc))
        raise ConfigError(f"{where}: could not load {str(path)!r}: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ConfigError(f"{where}: {str(path)!r} holds no 'model' state dict")
    if "args" not in state:
        log.info(fmt.MEGATRON_NO_ARGS_LINE)
    sd: dict[str, Any] = state["model"]
    missing, unexpected = _load_state(model, sd, layout, where=where)
    if missing or unexpected:  # Megatron: strict load raised, the non-strict retry returns None from DDP
        log.info(fmt.MEGATRON_LOAD_RETURN_LINE)
    loaded_iteration = 0 if finetune or release else iteration
    log.info(fmt.megatron_loaded_line(str(load_dir), loaded_iteration, tp=place.tp_size, pp=place.pp_size))
    optimizer = state.get("optimizer") if isinstance(state.get("optimizer"), dict) else None
    return LoadResult(loaded_iteration, release, missing, unexpected, optimizer)


def _load_distributed(model: nn.Module, load_dir: Path, directory: Path, layout: KeyLayout, rank: RankLayout, *,
                      finetune: bool, where: str, place: RankPlace, iteration: int, release: bool) -> LoadResult:
    from alignflow.convert.torch_dist import open_torch_dist
    from alignflow.errors import ConversionError

    own = set(layout.to_checkpoint.values())
    names = set(rank.names())
    if own != names:
        raise ConfigError(f"{where}: the twin's tensors and megatron-core's layout of this rank differ: "
                          f"{sorted(own ^ names)[:6]}")
    try:
        with open_torch_dist(directory, rank, partial=True) as ckpt:
            state: dict[str, Any] = {name: ckpt.read(name) for name in sorted(names)}
    except ConversionError as exc:
        raise ConfigError(f"{where}: could not load {directory}: {exc}") from None
    _load_state(model, state, layout, where=where)
    loaded_iteration = 0 if finetune or release else iteration
    log.info(fmt.megatron_loaded_line(str(load_dir), loaded_iteration, tp=place.tp_size, pp=place.pp_size))
    return LoadResult(loaded_iteration, release, (), (), None)


def _load_state(model: nn.Module, sd: dict[str, Any], layout: KeyLayout, *, where: str
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Copy matching tensors; return (missing, unexpected) checkpoint keys. Shape mismatches raise."""
    own = dict(model.state_dict())
    from_ckpt = layout.from_checkpoint
    expected = set(layout.to_checkpoint.values()) | layout.required_extra
    missing = tuple(sorted(expected - set(sd)))
    unexpected = tuple(sorted(set(sd) - layout.allowed))
    mismatched = []
    with torch.no_grad():
        for key, value in sd.items():
            local = from_ckpt.get(key)
            if local is None or not isinstance(value, torch.Tensor):
                continue
            target = own[local]
            if tuple(target.shape) != tuple(value.shape):
                mismatched.append(f"size mismatch for {key}: copying a param with shape {torch.Size(value.shape)} "
                                  f"from checkpoint, the shape in current model is {target.shape}.")
                continue
            target.copy_(value.to(target.dtype))  # bf16 checkpoints are cast up (fp32 compute)
    if mismatched:
        raise ConfigError(f"{where}: Error(s) in loading state_dict for GPTModel:\n\t" + "\n\t".join(mismatched))
    return missing, unexpected


def save_checkpoint(
    model: nn.Module,
    save_dir: Path,
    iteration: int,
    layout: KeyLayout,
    *,
    optimizer: dict[str, Any] | None,
    microseconds: bool,
    now: Callable[[], datetime],
    place: RankPlace = RankPlace(),
    tracker: bool = True,
) -> Path:
    """Write `iter_%07d/mp_rank_TT[_PPP]/model_optim_rng.pt` and then (`tracker`: the last writer) the tracker
    (tensors and primitives only)."""
    log.info(fmt.megatron_saving_line(now(), str(save_dir), iteration, microseconds=microseconds))
    own = model.state_dict()
    sd: dict[str, Any] = {}
    for local, ckpt in layout.to_checkpoint.items():
        sd[ckpt] = own[local].detach().clone().contiguous()
    for extra in sorted(layout.required_extra | (layout.optional_extra & {"output_layer._extra_state"})):
        sd[extra] = None
    if layout.required_extra == frozenset():  # local flavour: what Megatron's local modules emit
        for extra in sorted(layout.optional_extra):
            sd[extra] = None
    payload: dict[str, Any] = {"model": sd, "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration}
    if optimizer is not None:
        payload["optimizer"] = optimizer
    path = checkpoint_file(save_dir, iteration, rank_dir=place.dir_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    if tracker:
        write_atomic(save_dir / TRACKER, str(iteration))
    log.info(fmt.megatron_saved_line(str(save_dir), iteration))
    return path

