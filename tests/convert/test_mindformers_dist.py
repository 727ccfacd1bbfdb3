"""MindFormers distributed checkpoints: 8 per-rank files sliced by a MindSpore parallel strategy (device matrix
dp 2 x mp 4), and the unified safetensors MindSpore merges them into.

The slices are cut by MindSpore itself (`mindspore.parallel._tensor._load_tensor`, what a distributed load runs),
the strategy file is MindSpore's own protobuf message (`node_strategy_pb2.ParallelStrategyMap`, as MindFormers'
auto-parallel run saves it: MindSpore's CPU build refuses to compile a sharded graph, "Invalid backend: CPU", so
no run here can save one); alignflow's merge is checked against the unsliced tensors, against MindSpore's
`merge_sliced_parameter`, and against MindSpore's own `unified_safetensors` output read back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from alignflow.convert import convert_bf16, convert_to_megatron
from alignflow.convert.mindformers import open_mindformers
from alignflow.errors import ConversionError

from .synthetic import leftovers, read_mindformers, same_bits, source_state

pytestmark = pytest.mark.slow  # imports MindSpore and merges twin-size checkpoints

ms = pytest.importorskip("mindspore")

DEV_MATRIX = [2, 4]  # dp 2 x mp 4: eight ranks


def _tensor_map(shape: tuple[int, ...]) -> list[int]:
    """Split the first dimension that mp 4 divides (rows, else columns), replicate the rest over dp."""
    for i, n in enumerate(shape):
        if n % 4 == 0 and n >= 8:
            return [0 if j == i else -1 for j in range(len(shape))]
    return [-1] * len(shape)


def write_sliced(root: Path, tensors: dict[str, torch.Tensor], *, skip: tuple[int, ...] = (),
                 opt_shard: str | None = None) -> Path:
    """`rank_{r}/checkpoint_rank_{r}-1_10.safetensors` for the 8 ranks and `strategy/ckpt_strategy_rank_0.ckpt`."""
    from mindspore import Tensor
    from mindspore.parallel._tensor import _load_tensor
    from mindspore.train.node_strategy_pb2 import ParallelStrategyMap

    strategy = ParallelStrategyMap()
    strategy.current_stage = 0
    maps = {}
    for name, t in tensors.items():
        item = strategy.parallel_layout_item.add()
        item.param_name = name
        layouts = item.parallel_layouts
        layouts.dev_matrix.add().dim.extend(DEV_MATRIX)
        maps[name] = _tensor_map(tuple(t.shape))
        layouts.tensor_map.add().dim.extend(maps[name])
        layouts.param_split_shape.add()
        layouts.indices_offset.add()
        layouts.field = 0
        layouts.opt_weight_shard_step = 0
        layouts.opt_weight_shard_size = 4 if name == opt_shard else 0
    (root / "strategy").mkdir(parents=True)
    (root / "strategy" / "ckpt_strategy_rank_0.ckpt").write_bytes(strategy.SerializeToString())
    for rank in range(8):
        if rank in skip:
            continue
        part = {}
        for name, t in tensors.items():
            piece = _load_tensor(Tensor(t.numpy()), DEV_MATRIX, maps[name], rank_id=rank)
            part[name] = torch.from_numpy(np.ascontiguousarray(piece))
            if name == opt_shard:  # an optimizer-sharded slice: a quarter of the model-parallel one
                part[name] = part[name][: part[name].shape[0] // 4].clone()
        (root / f"rank_{rank}").mkdir()
        save_file(part, str(root / f"rank_{rank}" / f"checkpoint_rank_{rank}-1_10.safetensors"))
    return root / "strategy" / "ckpt_strategy_rank_0.ckpt"


def test_per_rank_files_merge_by_their_strategy_as_mindspore_merges_them(tmp_path: Path) -> None:
    src = source_state("twin-moe", dtype=torch.float32)
    strategy_file = write_sliced(tmp_path / "ckpt", src)
    with open_mindformers(tmp_path / "ckpt") as ckpt:  # the strategy found in strategy/ beside the ranks
        assert set(ckpt.tensors) == set(src)
        assert len(ckpt.files) == 8
        for name, want in src.items():
            assert tuple(ckpt.tensors[name].shape) == tuple(want.shape)
            assert same_bits(ckpt.read(name), want), name
    # MindSpore's merge of the same slices, for a split and a replicated tensor
    strategy = ms.build_searched_strategy(str(strategy_file))
    for name in ("embedding.word_embeddings.weight", "decoder.layers.0.input_layernorm.weight"):
        slices = [ms.Parameter(ms.Tensor(load_file(str(tmp_path / f"ckpt/rank_{r}/checkpoint_rank_{r}-1_10."
                                                        "safetensors"))[name].numpy()), name) for r in range(8)]
        merged = ms.merge_sliced_parameter(slices, strategy).asnumpy()
        assert np.array_equal(merged, src[name].numpy()), name


def test_mindspores_unified_safetensors_read_back_and_convert(tmp_path: Path) -> None:
    src = source_state("twin-moe", dtype=torch.float32)
    strategy_file = write_sliced(tmp_path / "ckpt", src)
    ms.unified_safetensors(str(tmp_path / "ckpt"), str(strategy_file), str(tmp_path / "unified"),
                           max_process_num=1)
    assert (tmp_path / "unified" / "param_name_map.json").is_file()
    with open_mindformers(tmp_path / "unified") as ckpt:
        assert set(ckpt.tensors) == set(src)
        assert all(same_bits(ckpt.read(k), v) for k, v in src.items())
    # the whole pipeline from the sliced base: bf16 as from the unsliced one, then torch_dist
    convert_bf16(tmp_path / "ckpt", tmp_path / "bf16")
    from .synthetic import write_mindformers

    write_mindformers(tmp_path / "whole", src)
    convert_bf16(tmp_path / "whole", tmp_path / "bf16-whole")
    got, want = read_mindformers(tmp_path / "bf16"), read_mindformers(tmp_path / "bf16-whole")
    assert set(got) == set(want)
    assert all(same_bits(got[k], want[k]) for k in want)


def test_what_cannot_be_merged_is_named(tmp_path: Path) -> None:
    src = source_state("twin-dense", dtype=torch.float32)
    write_sliced(tmp_path / "replica", src, skip=(5,))  # rank 1 holds rank 5's slice (dp replicas): enough
    with open_mindformers(tmp_path / "replica") as ckpt:
        assert all(same_bits(ckpt.read(k), v) for k, v in src.items())
    write_sliced(tmp_path / "missing", src, skip=(1, 5))
    with pytest.raises(ConversionError, match=r"distinct slices of the 4 its strategy .* a rank file is missing"):
        open_mindformers(tmp_path / "missing")
    write_sliced(tmp_path / "opt", src, opt_shard="output_layer.weight")
    with pytest.raises(ConversionError, match=r"output_layer\.weight: optimizer shard size 4 .*unified_safetensors"):
        open_mindformers(tmp_path / "opt")
    (tmp_path / "nostrategy/rank_0").mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "nostrategy/rank_0/checkpoint_rank_0-1_1.safetensors"))
    with pytest.raises(ConversionError, match="per-rank files without a strategy file"):
        convert_bf16(tmp_path / "nostrategy", tmp_path / "out")
    assert leftovers(tmp_path) == []
    unified = tmp_path / "u"
    unified.mkdir()
    save_file({"a": torch.zeros(2)}, str(unified / "part0.safetensors"))
    (unified / "param_name_map.json").write_text('{"weight_map": {"a": "part1.safetensors"}}')
    with pytest.raises(ConversionError, match=r"a: param_name_map\.json names part1\.safetensors, it is in part0"):
        open_mindformers(unified)


def test_a_sliced_base_converts_to_torch_dist(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    src = source_state("twin-dense", dtype=torch.float32)
    write_sliced(tmp_path / "ckpt", src)
    convert_bf16(tmp_path / "ckpt", tmp_path / "bf16")
    summary = convert_to_megatron(tmp_path / "bf16", tmp_path / "td", spec="twin-dense", ckpt_format="torch_dist",
                                  workers=2)
    assert summary.tensors == len(src)
