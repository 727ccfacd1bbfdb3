"""Megatron legacy checkpoints of several ranks: `iter_N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`, one file per
(tp, pp, ep) rank holding that rank's module-local state dict (docs/megatron.md#legacy-checkpoint-layout).

Which slice of which tensor each rank holds, and under which local name, is megatron-core's own sharding
(`alignflow.convert.sharding`, read from real `GPTModel`s): a rank's local tensor is assembled from the regions of
the global tensors its pieces name, and the global tensors are the TP = 1 model's tensors (the TP = 1 layout says
where each one lies). Reading is the inverse: each TP = 1 tensor is assembled from the rank files' local tensors.

Writing holds one pipeline stage at a time: the TP = 1 tensors that stage's ranks need, then each rank's state dict
while it is saved. A legacy rank file is one pickle, so a rank's whole state dict is in memory when it is written;
`torch_dist` (`alignflow.convert.torch_dist`) is the format that streams.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch

from alignflow.config.parallel import ParallelConfig
from alignflow.convert.dist_writer import TensorProducer, piece_view
from alignflow.convert.layout import CHECKPOINT_VERSION, MEGATRON_FILE_NAME, TRACKER
from alignflow.convert.sharding import Layouts, Piece, RankLayout, rank_file_dir
from alignflow.convert.summary import ProgressFn
from alignflow.convert.tensor_io import TensorMeta
from alignflow.convert.torch_dist import fill_region
from alignflow.convert.unreadable import reading
from alignflow.errors import ConversionError
from alignflow.staging import check_interrupted

log = logging.getLogger(__name__)

_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
Chunks = Iterator[tuple[tuple[int, ...], tuple[int, ...], Callable[[], torch.Tensor]]]


def rename_mtp(name: str, inner_from: str, inner_to: str) -> str:
    """`mtp.layers.K.<inner_from>.` -> `mtp.layers.K.<inner_to>.` (megatron-core renamed the MTP inner layer in
    0.17; the legacy format has no shim, docs/megatron.md#mtp-layers)."""
    if inner_from == inner_to or not name.startswith("mtp.layers."):
        return name
    return re.sub(rf"^(mtp\.layers\.\d+\.){re.escape(inner_from)}\.", rf"\g<1>{inner_to}.", name)


def write_shards(root: Path, layouts: Layouts, tp1: RankLayout, producer: TensorProducer, *, iteration: int,
                 layout_inner: str, file_inner: str, progress: ProgressFn | None = None) -> list[str]:
    """Write `root/<tracker>` and `root/iter_N/mp_rank_*/model_optim_rng.pt` for every rank of `layouts`, from the
    TP = 1 tensors `producer` makes (named as `tp1` names them). Returns the files written, relative to `root`."""
    group_of = {n: i for i, g in enumerate(producer.groups) for n in g}
    tp1_by_key: dict[str, list[tuple[Piece, str]]] = {}
    for t in tp1.tensors:
        for p in t.pieces:
            tp1_by_key.setdefault(p.key, []).append((p, t.name))
    out_dir = root / f"iter_{iteration:07d}"
    files = [TRACKER]
    total = sum(_numel(t.shape) for r in layouts.ranks for t in r.tensors)
    done = 0
    for stage in sorted({r.pp for r in layouts.ranks}):
        ranks = [r for r in layouts.ranks if r.pp == stage]
        keys = {p.key for r in ranks for t in r.tensors for p in t.pieces}
        groups = sorted({group_of[name] for k in keys for _, name in tp1_by_key[k]})
        made: dict[str, torch.Tensor] = {}
        for g in groups:
            check_interrupted()
            made.update(producer.produce(g))
        for rank in ranks:
            state: dict[str, torch.Tensor | None] = {}
            for local in rank.tensors:
                dtype = made[tp1_by_key[local.pieces[0].key][0][1]].dtype
                out = torch.empty(local.shape, dtype=dtype)
                for piece in local.pieces:
                    fill_region(piece_view(out, piece, prepended=True), piece.key, piece.offset,
                                _made_chunks(tp1_by_key[piece.key], made))
                state[rename_mtp(local.name, layout_inner, file_inner)] = out
                done += out.numel()
            for name in rank.extra_state:
                state[rename_mtp(name, layout_inner, file_inner)] = None
            rel = f"{out_dir.name}/{rank_file_dir(*rank.coordinate, layouts.parallel)}/{MEGATRON_FILE_NAME}"
            (root / rel).parent.mkdir(parents=True)
            torch.save({"model": state, "checkpoint_version": CHECKPOINT_VERSION, "iteration": int(iteration)},
                       root / rel)
            files.append(rel)
            if progress is not None:
                progress(done, total)
        made.clear()
    (root / TRACKER).write_text(str(iteration), encoding="utf-8")
    return files


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _made_chunks(entries: list[tuple[Piece, str]], made: Mapping[str, torch.Tensor]) -> Chunks:
    for piece, name in entries:
        yield piece.offset, piece.size, partial(piece_view, made[name], piece, prepended=True)


def rank_dirs(directory: Path) -> dict[tuple[int, int | None, int | None], Path]:
    """The `mp_rank_*` directories of an `iter_*` directory by their parsed indices."""
    out = {}
    for p in sorted(directory.glob("mp_rank_*")):
        m = _RANK_DIR.match(p.name)
        if m and p.is_dir():
            out[(int(m.group(1)), _int(m.group(2)), _int(m.group(3)))] = p
    return out


def _int(text: str | None) -> int | None:
    return int(text) if text is not None else None


def infer_parallel(directory: Path) -> ParallelConfig:
    """TP / PP / EP of a legacy checkpoint from its `mp_rank_*` names. `mp_rank_TT_NNN` is pipeline or expert
    parallel (Megatron-LM tells them apart by the current run's sizes, `find_checkpoint_rank_0`); here by content:
    every expert-parallel rank holds the final norm, only the last pipeline stage does."""
    dirs = rank_dirs(directory)
    if not dirs:
        raise ConversionError([f"{directory}: no mp_rank_* directory"], header="cannot open the Megatron checkpoint")
    tp = max(k[0] for k in dirs) + 1
    seconds = [k[1] for k in dirs if k[1] is not None]
    thirds = [k[2] for k in dirs if k[2] is not None]
    if thirds:
        ep = max(thirds) + 1
        return ParallelConfig(tp=tp, pp=max(seconds) + 1, ep=ep, dp=ep)
    if not seconds:
        return ParallelConfig(tp=tp)
    n = max(seconds) + 1
    first = load_rank_file(dirs[(0, 0, None)] / MEGATRON_FILE_NAME)
    if "decoder.final_layernorm.weight" in first.get("model", {}):
        return ParallelConfig(tp=tp, ep=n, dp=n)
    return ParallelConfig(tp=tp, pp=n)


class MegatronShards:
    """A many-rank legacy checkpoint opened as a `TensorSource` of TP = 1 state-dict names in the planning
    megatron-core's naming (each read assembles one tensor from the rank files' memory-mapped tensors). The files
    may name the MTP inner layer as another megatron-core version does (`file_inner`)."""

    def __init__(self, path: Path, directory: Path, layouts: Layouts, tp1: RankLayout,
                 files: Mapping[tuple[int, int, int], Path], iteration: int, *, layout_inner: str,
                 file_inner: str) -> None:
        self.path, self.directory, self.file, self.iteration = path, directory, directory, iteration
        self._rename = (layout_inner, file_inner)
        self._tp1 = {t.name: t for t in tp1.tensors}
        self._files = dict(files)
        self._loaded: dict[tuple[int, int, int], dict[str, Any]] = {}
        self._chunks: dict[str, list[tuple[Piece, tuple[int, int, int], str]]] = {}
        for rank in layouts.ranks:
            for t in rank.tensors:
                for p in t.pieces:
                    if p.main:
                        self._chunks.setdefault(p.key, []).append((p, rank.coordinate, t.name))
        self.tensors: dict[str, TensorMeta] = {}
        for name, t in self._tp1.items():
            _, coordinate, local_name = self._chunks[t.pieces[0].key][0]
            self.tensors[name] = TensorMeta(t.shape, self._local(coordinate, local_name).dtype)
        self.others: dict[str, Any] = dict.fromkeys(tp1.extra_state)
        self.checkpoint_version: Any = self._state(layouts.ranks[0].coordinate).get("checkpoint_version")

    def _state(self, coordinate: tuple[int, int, int]) -> dict[str, Any]:
        if coordinate not in self._loaded:
            self._loaded[coordinate] = load_rank_file(self._files[coordinate])
        return self._loaded[coordinate]

    def _local(self, coordinate: tuple[int, int, int], name: str) -> torch.Tensor:
        tensor: torch.Tensor = self._state(coordinate)["model"][rename_mtp(name, *self._rename)]
        return tensor

    def read(self, name: str) -> torch.Tensor:
        local = self._tp1[name]
        out = torch.empty(local.shape, dtype=self.tensors[name].dtype)
        for piece in local.pieces:
            fill_region(piece_view(out, piece, prepended=True), piece.key, piece.offset, self._rank_chunks(piece.key))
        return out

    def _rank_chunks(self, key: str) -> Chunks:
        for piece, coordinate, local_name in self._chunks[key]:
            def load(piece: Piece = piece, coordinate: tuple[int, int, int] = coordinate,
                     local_name: str = local_name) -> torch.Tensor:
                return piece_view(self._local(coordinate, local_name).contiguous(), piece, prepended=True)
            yield piece.offset, piece.size, load

    def close(self) -> None:
        self._loaded.clear()

    def __enter__(self) -> MegatronShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_rank_file(file: Path) -> dict[str, Any]:
    """One rank's `model_optim_rng.pt`; a damaged one is a `ConversionError` naming it (alignflow.convert.unreadable),
    a payload that is not a dict an empty one (its missing 'model' is then named)."""
    with reading(file, header="cannot read the Megatron checkpoint"):
        payload = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    return payload if isinstance(payload, dict) else {}


def file_mtp_inner(directory: Path, candidates: tuple[str, ...]) -> str | None:
    """Which MTP inner-layer name the rank files use (None: no MTP key in them)."""
    for d in rank_dirs(directory).values():
        model = load_rank_file(d / MEGATRON_FILE_NAME).get("model", {})
        for key in model:
            for inner in candidates:
                if re.match(rf"^mtp\.layers\.\d+\.{re.escape(inner)}\.", key):
                    return inner
    return None


def open_shards(src: Path, directory: Path, layouts: Layouts, tp1: RankLayout, *, layout_inner: str,
                file_inner: str) -> MegatronShards:
    """Open the rank files of `directory` (an `iter_*` directory) laid out as `layouts`; every rank file must be
    there and hold exactly its layout's names (`ConversionError` listing what is missing or unexpected)."""
    header = f"cannot open the Megatron checkpoint {src}"
    dirs = {p.name: p for p in rank_dirs(directory).values()}
    problems: list[str] = []
    files: dict[tuple[int, int, int], Path] = {}
    for rank in layouts.ranks:
        name = rank_file_dir(*rank.coordinate, layouts.parallel)
        file = dirs[name] / MEGATRON_FILE_NAME if name in dirs else directory / name / MEGATRON_FILE_NAME
        if not file.is_file():
            problems.append(f"{file}: missing (rank tp {rank.tp} pp {rank.pp} ep {rank.ep} of tp "
                            f"{layouts.parallel.tp} pp {layouts.parallel.pp} ep {layouts.parallel.ep})")
            continue
        files[rank.coordinate] = file
        payload = load_rank_file(file)
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(model, dict):
            problems.append(f"{file}: no 'model' state dict")
            continue
        # `_extra_state` may be absent: the local spec's load hook sets it
        # (docs/megatron.md#where-_extra_state-keys-come-from)
        want = {rename_mtp(n, layout_inner, file_inner) for n in rank.names()}
        extra = {rename_mtp(n, layout_inner, file_inner) for n in rank.extra_state}
        problems += [f"{file}: missing key {k!r}" for k in sorted(want - set(model))]
        problems += [f"{file}: unexpected key {k!r}" for k in sorted(set(model) - want - extra)]
        for t in rank.tensors:
            value = model.get(rename_mtp(t.name, layout_inner, file_inner))
            if isinstance(value, torch.Tensor) and tuple(value.shape) != t.shape:
                problems.append(f"{file}: {t.name} is {list(value.shape)}, rank tp {rank.tp} pp {rank.pp} ep "
                                f"{rank.ep} of this layout holds {list(t.shape)}")
    strays = sorted(set(dirs) - {rank_file_dir(*r.coordinate, layouts.parallel) for r in layouts.ranks})
    problems += [f"{directory / d}: a rank directory the layout does not have" for d in strays]
    if problems:
        raise ConversionError(problems, header=header)
    payload = load_rank_file(files[layouts.ranks[0].coordinate])
    return MegatronShards(src, directory, layouts, tp1, files, int(payload.get("iteration", 0)),
                          layout_inner=layout_inner, file_inner=file_inner)
