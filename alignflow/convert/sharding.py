"""Where each rank's tensors live in Megatron's global tensors, as megatron-core itself shards them.

A `RankLayout` is one (tp, pp, ep) rank of a Megatron training: its state-dict names (module-local: layer numbers
restart on each pipeline stage, experts on each expert rank) and, for each tensor, the `Piece`s it is made of - a
region of a global tensor named by its distributed-checkpoint key (`decoder.layers.1.mlp.experts.experts.
linear_fc1.weight`, experts stacked on a prepended axis, local norms under their TE names) and the view of the
local tensor that holds it (a SwiGLU `linear_fc1` is two pieces, its gate and up halves, as megatron-core's
`apply_swiglu_sharded_factory` chunks it). Both Megatron checkpoint formats follow from it:

- `torch_dist` stores the global tensors (`alignflow.convert.torch_dist`); the TP = 1 layout names them;
- the legacy format stores one `mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt` per rank holding its local tensors
  (`alignflow.convert.megatron_shards`).

The layouts are read from `GPTModel.sharded_state_dict()` of real megatron-core models built on `meta`
(`alignflow.convert.mcore`), one per distinct (tp, pp, ep) coordinate, in a child process of their own
(`plan_layouts`): megatron-core's parallel state is process-global, and the planner re-initialises it per rank.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from alignflow.config.model import ModelConfig
from alignflow.config.parallel import ParallelConfig
from alignflow.convert.layout import write_atomic
from alignflow.errors import ConversionError
from alignflow.once import exclusive

log = logging.getLogger(__name__)

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Piece:
    """A region of the global tensor `key` that one local tensor holds, and where it holds it.

    `offset` and `size` are in the global tensor's coordinates, prepended axes included (their extent is 1);
    `view` is `(size, stride, storage_offset)` of the piece inside the contiguous local tensor, prepended axes
    excluded. `main`: this rank holds the main replica (Megatron's `replica_id` all zero), the one a save writes.
    """

    key: str
    global_shape: Shape
    offset: Shape
    size: Shape
    view: tuple[Shape, Shape, int]
    main: bool

    @property
    def local_size(self) -> Shape:
        return self.view[0]

    def to_json(self) -> list[Any]:
        return [self.key, self.global_shape, self.offset, self.size, self.view, self.main]

    @classmethod
    def from_json(cls, data: list[Any]) -> Piece:
        key, gshape, offset, size, (vsize, vstride, voff), main = data
        return cls(key, tuple(gshape), tuple(offset), tuple(size), (tuple(vsize), tuple(vstride), int(voff)), main)


@dataclass(frozen=True, slots=True)
class LocalTensor:
    """One tensor of a rank's state dict: its module-local name, shape, and the pieces it is made of."""

    name: str
    shape: Shape
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, slots=True)
class RankLayout:
    """The state dict of one (tp, pp, ep) rank: tensors in state-dict order, and its `_extra_state` names (None in a
    local-spec legacy checkpoint, a sharded object in torch_dist)."""

    tp: int
    pp: int
    ep: int
    tensors: tuple[LocalTensor, ...]
    extra_state: tuple[str, ...]

    @property
    def coordinate(self) -> tuple[int, int, int]:
        return (self.tp, self.pp, self.ep)

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "extra_state": list(self.extra_state),
                "tensors": [[t.name, t.shape, [p.to_json() for p in t.pieces]] for t in self.tensors]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankLayout:
        tensors = tuple(LocalTensor(name, tuple(shape), tuple(Piece.from_json(p) for p in pieces))
                        for name, shape, pieces in data["tensors"])
        return cls(int(data["tp"]), int(data["pp"]), int(data["ep"]), tensors, tuple(data["extra_state"]))


@dataclass(frozen=True, slots=True)
class Layouts:
    """Every rank coordinate of one parallel layout, and the megatron-core version that planned it."""

    parallel: ParallelConfig
    ranks: tuple[RankLayout, ...]
    megatron_core: str

    def rank(self, tp: int, pp: int, ep: int) -> RankLayout:
        for r in self.ranks:
            if r.coordinate == (tp, pp, ep):
                return r
        raise KeyError((tp, pp, ep))

    def global_shapes(self) -> dict[str, Shape]:
        return {p.key: p.global_shape for r in self.ranks for t in r.tensors for p in t.pieces}


def rank_file_dir(tp: int, pp: int, ep: int, parallel: ParallelConfig) -> str:
    """Megatron-LM's legacy shard directory (`get_checkpoint_name`): `mp_rank_TT`, `_PPP` with pipeline parallelism,
    `_EEE` with expert parallelism."""
    name = f"mp_rank_{tp:02d}"
    if parallel.pp > 1:
        name += f"_{pp:03d}"
    if parallel.ep > 1:
        name += f"_{ep:03d}"
    return name


def layout_problems(model: ModelConfig, parallel: ParallelConfig) -> list[str]:
    """What megatron-core refuses, or loads with other global shapes, when it builds `model` at `parallel`'s
    TP / PP / EP - arithmetic only, for preflight; a conversion builds the models themselves (`plan_layouts`).

    Sources (megatron-core 0.16-0.19): `TransformerConfig.__post_init__` (heads and query groups divisible by tp),
    `tensor_parallel.utils.divide` in Column/RowParallelLinear (every split dimension), `get_num_layers_to_build`
    (an even split of the layers without `--decoder-first/last-pipeline-num-layers`), `MoELayer` (experts divisible
    by ep) and Megatron-LM's `_vocab_size_with_padding` (the vocabulary pads to `make_vocab_size_divisible_by x
    tp`: another embedding shape than the checkpoint's)."""
    tp, pp, ep = parallel.tp, parallel.pp, parallel.ep
    out = []
    checks = [("num_attention_heads", model.num_attention_heads, "tp", tp),
              ("num_query_groups", model.query_groups, "tp", tp), ("ffn_hidden_size", model.ffn_hidden_size, "tp", tp),
              ("hidden_size", model.hidden_size, "tp", tp), ("num_layers", model.num_layers, "pp", pp)]
    if model.moe is not None:
        checks += [("moe.ffn_hidden_size", model.moe.ffn_hidden_size, "tp", tp),
                   ("moe.num_experts", model.moe.num_experts, "ep", ep)]
        if model.moe.shared_expert_intermediate_size is not None:
            checks.append(("moe.shared_expert_intermediate_size", model.moe.shared_expert_intermediate_size, "tp",
                           tp))
    elif ep > 1:
        out.append(f"ep {ep}: the model has no experts")
    for name, value, what, size in checks:
        if size > 1 and value % size:
            out.append(f"model.{name} {value} is not divisible by {what} {size}")
    multiple = model.make_vocab_size_divisible_by * tp
    padded = -(-model.vocab_size // multiple) * multiple
    if padded != model.vocab_size:
        out.append(f"vocab_size {model.vocab_size} pads to {padded} at tp {tp} (a multiple of "
                   f"make_vocab_size_divisible_by {model.make_vocab_size_divisible_by} x tp): another embedding "
                   "than the checkpoint's")
    return out


# --- planning (inside a process that owns torch.distributed) ---------------------------------------------------

def _pieces_of(name: str, value: Any, base: Any) -> list[Piece]:
    """The pieces of one sharded-state-dict entry (a ShardedTensor, or the list a factory built)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, is_main_replica

    items = value if isinstance(value, list) else [value]
    pieces = []
    for item in items:
        assert isinstance(item, ShardedTensor), f"{name}: {type(item).__name__} in a model's sharded state dict"
        assert item.flattened_range is None, f"{name}: flattened shards are optimizer state"
        data = item.data
        origin = data._base if data._base is not None else data
        assert origin is base, f"{name}: its sharded tensor does not view the module's own parameter"
        prepend = item.prepend_axis_num
        size = (1,) * prepend + tuple(data.shape)
        pieces.append(Piece(item.key, tuple(item.global_shape), tuple(item.global_offset), size,
                            (tuple(data.shape), tuple(data.stride()), int(data.storage_offset())),
                            bool(is_main_replica(item.replica_id))))
    return pieces


def _rank_layout(model: ModelConfig, parallel: ParallelConfig) -> RankLayout:
    from alignflow.convert.mcore import build_gpt_model

    return model_layout(build_gpt_model(model, device="meta", parallel=parallel))


def model_layout(gpt: Any) -> RankLayout:
    """The layout of this rank's `GPTModel` (its `sharded_state_dict()` with Megatron-LM's content metadata)."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensorFactory

    from alignflow.convert.mcore import SHARDED_METADATA

    state = gpt.state_dict(keep_vars=True)
    sharded = gpt.sharded_state_dict(metadata=dict(SHARDED_METADATA))
    tensors: list[LocalTensor] = []
    extra: list[str] = []
    for name, base in state.items():
        value = sharded.get(name)
        if name.endswith("._extra_state"):
            assert value is None or isinstance(value, ShardedObject), name
            extra.append(name)
            continue
        if value is None:
            raise ConversionError([f"{name}: in GPTModel.state_dict() but not in its sharded_state_dict()"],
                                  header="megatron-core layout")
        if isinstance(value, ShardedTensorFactory):
            value = value.build()
        tensors.append(LocalTensor(name, tuple(base.shape), tuple(_pieces_of(name, value, base))))
    unknown = sorted(set(sharded) - set(state))
    if unknown:
        raise ConversionError([f"{k}: in sharded_state_dict() but not in state_dict()" for k in unknown],
                              header="megatron-core layout")
    return RankLayout(ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(),
                      ps.get_expert_model_parallel_rank(), tuple(tensors), tuple(extra))


def plan_in_process(model: ModelConfig, parallel: ParallelConfig) -> Layouts:
    """Every distinct (tp, pp, ep) rank of `parallel` (data-parallel replicas are the same), planned here: this
    process must not have torch.distributed initialised. The world is `tp x pp x ep` ranks (dp = ep, the
    smallest data-parallel size that holds the expert ranks)."""
    from alignflow.convert.mcore import fake_world, megatron_core_version, padded_vocab

    padded = padded_vocab(model, parallel)
    if padded != model.vocab_size:
        raise ConversionError([f"vocab_size {model.vocab_size} pads to {padded} at tp {parallel.tp} (Megatron pads "
                               f"to a multiple of make_vocab_size_divisible_by {model.make_vocab_size_divisible_by} "
                               f"x tp): the embedding would not be the checkpoint's; choose a divisor or a tp that "
                               "divides the vocabulary"], header="layout cannot hold the model")
    world = ParallelConfig(tp=parallel.tp, pp=parallel.pp, ep=parallel.ep, dp=parallel.ep)
    ranks: dict[tuple[int, int, int], RankLayout] = {}
    for rank in range(world.world_size):
        with fake_world(rank, world):
            layout = _rank_layout(model, world)
        ranks.setdefault(layout.coordinate, layout)
    return Layouts(parallel, tuple(ranks[c] for c in sorted(ranks)), megatron_core_version())


def plan_layouts(model: ModelConfig, parallel: ParallelConfig | None = None) -> Layouts:
    """`plan_in_process` in a child process (cached per model and layout, in this process and in the layout
    cache); `ConversionError` with the child's error when megatron-core cannot build the model at that layout.

    A missing entry is planned by one process while the others wait (`alignflow.once.exclusive` on a lock beside
    it, issue 49: several conversions of one model starting at once each spent seconds on megatron-core); the
    waiters then read the entry, checked against the request it records."""
    parallel = parallel or ParallelConfig()
    key = _request(model, parallel)
    data = _read_cache(key)
    if data is None:
        with _cache_lock(key):
            data = _read_cache(key)
            if data is None:
                data = _planned(key)
                _write_cache(key, data)
    ranks = tuple(RankLayout.from_json(r) for r in data["ranks"])
    return Layouts(parallel, ranks, data["megatron_core"])


def _request(model: ModelConfig, parallel: ParallelConfig) -> str:
    return json.dumps({"model": model.model_dump(mode="json"),
                       "parallel": {"tp": parallel.tp, "pp": parallel.pp, "ep": parallel.ep}}, sort_keys=True)


# --- the layout cache: megatron-core's layouts are a pure function of the model, the layout and its version -------

CACHE_ENV = "ALIGNFLOW_CACHE_DIR"
_CACHE_FORMAT = 1


def cache_dir() -> Path:
    """`$ALIGNFLOW_CACHE_DIR/mcore-layouts`, else `~/.cache/alignflow/mcore-layouts` (resolved at call time)."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "alignflow") / "mcore-layouts"


def _installed_megatron_core() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def _cache_path(request: str) -> Path | None:
    version = _installed_megatron_core()
    if version is None:
        return None
    digest = hashlib.sha256(json.dumps([_CACHE_FORMAT, version, request]).encode()).hexdigest()
    return cache_dir() / f"{digest[:32]}.json"


def _read_cache(request: str) -> dict[str, Any] | None:
    path = _cache_path(request)
    if path is None or not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data if data.get("request") == request and isinstance(data.get("ranks"), list) else None
    except (OSError, json.JSONDecodeError):
        return None  # a damaged entry is a miss; it is written again


def _write_cache(request: str, data: Mapping[str, Any]) -> None:
    path = _cache_path(request)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({**data, "request": request}))
    except OSError as exc:  # a cache that cannot be written costs time, never a conversion
        log.info("layout cache %s not written: %s", path, exc)


@contextmanager
def _cache_lock(request: str) -> Iterator[None]:
    """The lock of the layout cache's entry for `request`, held while it is planned; none where the cache cannot be
    written (the plan then costs time, never a conversion)."""
    path = _cache_path(request)
    with contextlib.ExitStack() as held:
        if path is not None:
            try:
                held.enter_context(exclusive(path.with_suffix(".lock"), what=f"the megatron-core layout {path.stem}"))
            except OSError as exc:
                log.info("layout cache %s not locked: %s", path, exc)
        yield


def cached_layout(model: ModelConfig) -> RankLayout | None:
    """The TP = 1 layout of `model` from the layout cache (None: not there yet)."""
    data = _read_cache(_request(model, ParallelConfig()))
    return RankLayout.from_json(data["ranks"][0]) if data is not None else None


def store_layout(model: ModelConfig, layout: RankLayout) -> None:
    """Keep the TP = 1 layout megatron-core built for `model` (`write_torch_dist` plans with it next time)."""
    from alignflow.convert.mcore import megatron_core_version

    _write_cache(_request(model, ParallelConfig()), {"megatron_core": megatron_core_version(),
                                                     "ranks": [layout.to_json()]})


@lru_cache(maxsize=16)
def _planned(request: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        done = subprocess.run([sys.executable, "-m", "alignflow.convert.sharding"], input=request, text=True,
                              capture_output=True, env=env, timeout=1800, check=False)
    except subprocess.TimeoutExpired:
        raise ConversionError(["megatron-core layout planner did not finish in 30 minutes"],
                              header="layout planning failed") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-12:]
        raise ConversionError(tail or [f"planner exited {done.returncode}"], header="layout planning failed")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _main() -> int:
    """`python -m alignflow.convert.sharding`: a JSON request on stdin, the layouts as JSON on stdout."""
    import warnings

    warnings.simplefilter("ignore")
    request = json.loads(sys.stdin.read())
    model = ModelConfig.model_validate(request["model"])
    parallel = ParallelConfig(**request["parallel"])
    try:
        layouts = plan_in_process(model, parallel)
    except ConversionError as exc:
        sys.stderr.write("\n".join(exc.problems) + "\n")
        return 1
    sys.stdout.write(json.dumps({"megatron_core": layouts.megatron_core,
                                 "ranks": [r.to_json() for r in layouts.ranks]}))
    return 0


def pieces_by_key(layout: RankLayout) -> Iterator[tuple[Piece, LocalTensor]]:
    for tensor in layout.tensors:
        for piece in tensor.pieces:
            yield piece, tensor


if __name__ == "__main__":
    sys.exit(_main())
