"""Open any Megatron checkpoint for reading as TP = 1 tensors: a single legacy file, legacy files of many ranks, or
torch_dist - told apart as Megatron-LM tells them apart (`_get_checkpoint_format`: a `dist_checkpointing`
`metadata.json` is torch_dist, `mp_rank_*` entries are the legacy format).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.config.model import ModelConfig
from alignflow.config.parallel import ParallelConfig
from alignflow.convert.layout import MTP_INNER_LAYER, TRACKER, mtp_inner_layer
from alignflow.convert.summary import CkptFormat
from alignflow.errors import ConversionError


@dataclass(frozen=True, slots=True)
class MegatronFormat:
    """What a Megatron checkpoint directory holds: the format and the layout its files are written for."""

    ckpt_format: CkptFormat
    parallel: ParallelConfig  # torch_dist: none in particular (1s)
    directory: Path  # the iter_* / release directory

    @property
    def single_file(self) -> bool:
        return self.ckpt_format == "torch" and (self.parallel.tp, self.parallel.pp, self.parallel.ep) == (1, 1, 1)


def detect(src: Path) -> MegatronFormat:
    """The format of `src` (a tracker directory, an `iter_*` directory, or a legacy `.pt` file)."""
    from alignflow.convert.megatron_shards import infer_parallel, rank_dirs
    from alignflow.convert.torch_dist import is_torch_dist, resolve_directory

    src = Path(src)
    if src.is_file():
        return MegatronFormat("torch", ParallelConfig(), src.parent.parent)
    directory, _ = resolve_directory(src) if (src / TRACKER).is_file() else (src, None)
    if is_torch_dist(directory):
        return MegatronFormat("torch_dist", ParallelConfig(), directory)
    if len(rank_dirs(directory)) > 1:
        return MegatronFormat("torch", infer_parallel(directory), directory)
    return MegatronFormat("torch", ParallelConfig(), directory)


def open_distributed(src: Path, fmt: MegatronFormat, model: ModelConfig) -> Any:
    """A `TensorSource` of TP = 1 names (in the installed megatron-core's naming) over a torch_dist checkpoint or
    legacy files of many ranks, checked against megatron-core's layout of `model`."""
    from alignflow.convert.mcore import megatron_core_version
    from alignflow.convert.megatron_shards import file_mtp_inner, open_shards
    from alignflow.convert.sharding import plan_layouts
    from alignflow.convert.torch_dist import open_torch_dist

    tp1 = plan_layouts(model).ranks[0]
    if fmt.ckpt_format == "torch_dist":
        return open_torch_dist(src, tp1)
    installed = mtp_inner_layer(".".join(megatron_core_version().split(".")[:2]))
    names = tuple(name for _, name in MTP_INNER_LAYER)
    file_inner = file_mtp_inner(fmt.directory, names) or installed
    try:
        layouts = plan_layouts(model, fmt.parallel)
    except ConversionError as exc:
        raise ConversionError(exc.problems, header=f"{src}: files for tp {fmt.parallel.tp} pp {fmt.parallel.pp} ep "
                              f"{fmt.parallel.ep}, which megatron-core cannot build for this model") from None
    return open_shards(src, fmt.directory, layouts, tp1, layout_inner=installed, file_inner=file_inner)
