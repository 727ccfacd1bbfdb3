"""Step 2: bf16 conversion of MindFormers checkpoints (single file, multi-rank shards, legacy .ckpt)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from alignflow.convert import convert_bf16
from alignflow.errors import ConversionError

from .synthetic import COMMON, bits, leftovers, same_bits, write_mindformers

# fp32 bit patterns of the edge cases of a round-to-nearest-even cast to bf16
EDGE_BITS = [
    0x00000000, 0x80000000,              # +0, -0
    0x7F800000, 0xFF800000,              # +inf, -inf
    0x7FC00000, 0xFFC00000, 0x7F800001,  # quiet NaNs, a signalling NaN with payload
    0x00000001, 0x80000001, 0x007FFFFF,  # smallest subnormals, largest subnormal
    0x00008000, 0x00018000,              # subnormal ties (to even: down, up)
    0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,  # smallest normal, fp32 max (rounds to inf), -max
    0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000,  # bf16 max, just below the tie, the tie that overflows to inf
    0x3F808000, 0x3F818000,              # 1.0 + half ulp (tie -> even, down), 1.0078125 + half ulp (tie -> up)
    0x3F807FFF, 0x3F808001,              # just below / above a tie
    0x3F800000, 0xBF800000, 0x40490FDB,  # 1, -1, pi
]


def rne_reference(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even fp32 -> bf16 on the bits, independent of torch (NaNs excluded by the caller)."""
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    edge = torch.tensor(np.array(EDGE_BITS, dtype=np.uint32).view(np.int32)).view(torch.float32)
    wide = torch.randn(4096, generator=g) * torch.pow(10.0, torch.empty(4096).uniform_(-44, 38, generator=g))
    return {
        "edge": edge,
        "wide": wide,
        "weight": torch.randn(64, 48, generator=g),
        "half": torch.randn(33, generator=g).to(torch.float16),
        "double": torch.randn(5, 7, generator=g, dtype=torch.float64),
    }


def test_cast_is_bit_identical_to_torch_and_round_to_nearest_even(tmp_path):
    src = _inputs()
    write_mindformers(tmp_path / "base", src)
    convert_bf16(tmp_path / "base", tmp_path / "bf16")
    out = safe_open(str(tmp_path / "bf16/iteration_00000010/checkpoint-model-0000000-0000001.safetensors"), "pt")
    for name, value in src.items():
        got = out.get_tensor(name)
        assert got.dtype == torch.bfloat16
        assert same_bits(got, value.to(torch.bfloat16)), name
    for name in ("edge", "wide", "weight"):
        x = src[name].numpy()
        finite_or_inf = ~np.isnan(x)
        got = bits(out.get_tensor(name)).numpy().view(np.uint16)
        assert np.array_equal(got[finite_or_inf], rne_reference(x)[finite_or_inf]), name
        assert np.isnan(out.get_tensor(name).float().numpy()[~finite_or_inf]).all()
    edge = bits(out.get_tensor("edge")).numpy().view(np.uint16)
    by_bits = dict(zip(EDGE_BITS, edge.tolist(), strict=True))
    assert by_bits[0x7F7FFFFF] == 0x7F80  # fp32 max rounds to +inf
    assert by_bits[0x3F808000] == 0x3F80
    assert by_bits[0x3F818000] == 0x3F82
    assert by_bits[0x00000001] == 0x0000
    assert by_bits[0x007FFFFF] == 0x0080


def test_layout_drops_optimizer_and_counters_keeps_expert_bias_fp32(tmp_path):
    g = torch.Generator().manual_seed(0)
    model = {
        "embedding.word_embeddings.weight": torch.randn(16, 8, generator=g),
        "decoder.layers.0.mlp.expert_bias": torch.randn(4, generator=g),
        "decoder.layers.0.mlp.tokens_per_expert": torch.ones(4),
        "decoder.layers.0.mlp.router.global_tokens_per_expert": torch.ones(4),
        "decoder.layers.0.mlp.router.ga_steps": torch.ones(()),
        "decoder.layers.0.mlp.router.tid2eid": torch.arange(16, dtype=torch.int64),
        "adam_m.embedding.word_embeddings.weight": torch.zeros(16, 8),
        "global_step": torch.ones(1),
    }
    opt = {"adam_v.embedding.word_embeddings.weight": torch.zeros(16, 8),
           "main_param.embedding.word_embeddings.weight": torch.zeros(16, 8),
           "max_exp_avg_sq.embedding.word_embeddings.weight": torch.zeros(16, 8)}
    common = {**COMMON, "data_plan_state": {"x": 1}}
    write_mindformers(tmp_path / "base", model, iteration=1000, prefix="custom", common=common, optimizer=opt)
    summary = convert_bf16(tmp_path / "base", tmp_path / "bf16")

    out = tmp_path / "bf16"
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "1000"
    it_dir = out / "iteration_00001000"
    assert sorted(p.name for p in it_dir.iterdir()) == ["common.json", "custom-model-0000000-0000001.safetensors"]
    common_out = json.loads((it_dir / "common.json").read_text())
    assert list(common_out) == ["epoch_num", "step_num", "global_step", "loss_scale", "global_batch_size",
                                "consumed_samples", "ckpt_status"]
    assert common_out == COMMON
    f = safe_open(str(it_dir / "custom-model-0000000-0000001.safetensors"), "pt")
    assert sorted(f.keys()) == ["decoder.layers.0.mlp.expert_bias", "decoder.layers.0.mlp.router.tid2eid",
                                "embedding.word_embeddings.weight"]
    assert f.get_tensor("decoder.layers.0.mlp.expert_bias").dtype == torch.float32
    assert torch.equal(f.get_tensor("decoder.layers.0.mlp.expert_bias"), model["decoder.layers.0.mlp.expert_bias"])
    assert torch.equal(f.get_tensor("decoder.layers.0.mlp.router.tid2eid"), torch.arange(16))
    assert set(summary.dropped) == {"decoder.layers.0.mlp.tokens_per_expert", "global_step",
                                    "decoder.layers.0.mlp.router.global_tokens_per_expert",
                                    "decoder.layers.0.mlp.router.ga_steps", "adam_m.embedding.word_embeddings.weight",
                                    *opt}
    assert summary.tensors == 3
    assert summary.iteration == 1000
    assert dict(summary.dtypes) == {"bfloat16": 1, "float32": 1, "int64": 1}
    assert any("data_plan_state" in n for n in summary.notes)
    assert json.loads(json.dumps(summary.to_json()))["output_files"][2].endswith("custom-model-0000000-0000001"
                                                                                  ".safetensors")


def _sharded(tmp_path, *, drop_file=False, second_row=3):
    """Two ranks: a row-split, a column-split and a replicated tensor, described by metadata.json."""
    g = torch.Generator().manual_seed(3)
    full = {"a": torch.randn(6, 4, generator=g), "b": torch.randn(3, 8, generator=g), "c": torch.randn(5, generator=g)}
    it_dir = tmp_path / "base" / "iteration_00000002"
    it_dir.mkdir(parents=True)
    files = ["p-model-0000000-0000002.safetensors", "p-model-0000001-0000002.safetensors"]
    save_file({"a": full["a"][:3].contiguous(), "b": full["b"][:, :4].contiguous(), "c": full["c"]},
              str(it_dir / files[0]))
    if not drop_file:
        save_file({"a": full["a"][3:].contiguous(), "b": full["b"][:, 4:].contiguous(), "c": full["c"]},
                  str(it_dir / files[1]))
    save_file({"adam_m.a": torch.zeros(3, 4)}, str(it_dir / "p-opt-0000000-0000002.safetensors"))

    def chunk(offset, shape):
        return {"global_offset": offset, "local_shape": shape}

    def store(name, offset, rank):
        return {str((name, tuple(offset))): [{"file_name": files[rank], "storage_rank": rank, "rank_group": [rank]}]}

    a1 = [second_row, 0]
    meta = {
        "state_dict_metadata": {
            "a": {"properties": {"dtype": "Float32"}, "global_shape": [6, 4], "axis_fragmentations": [2, 1],
                  "layout": None, "chunk": [chunk([0, 0], [3, 4]), chunk(a1, [3, 4])]},
            "b": {"properties": {"dtype": "Float32"}, "global_shape": [3, 8], "axis_fragmentations": [1, 2],
                  "layout": None, "chunk": [chunk([0, 0], [3, 4]), chunk([0, 4], [3, 4])]},
            "c": {"properties": {"dtype": "Float32"}, "global_shape": [5], "axis_fragmentations": [1],
                  "layout": None, "chunk": [chunk([0], [5]), chunk([0], [5])]},
            "adam_m.a": {"properties": {"dtype": "Float32"}, "global_shape": [3, 4], "axis_fragmentations": [1, 1],
                         "layout": None, "chunk": [chunk([0, 0], [3, 4])]},
        },
        "storage_data": {**store("a", [0, 0], 0), **store("a", a1, 1), **store("b", [0, 0], 0),
                         **store("b", [0, 4], 1), **store("c", [0], 0),
                         str(("adam_m.a", (0, 0))): [{"file_name": "p-opt-0000000-0000002.safetensors",
                                                      "storage_rank": 0, "rank_group": [0]}]},
    }
    (it_dir / "metadata.json").write_text(json.dumps(meta, separators=(",", ":")))
    (it_dir / "common.json").write_text(json.dumps(COMMON))
    return full


def test_multi_rank_shards_merge_at_their_global_offsets(tmp_path):
    full = _sharded(tmp_path)
    summary = convert_bf16(tmp_path / "base/iteration_00000002", tmp_path / "bf16")
    assert summary.iteration == 2
    assert summary.dropped == ("adam_m.a",)
    it_dir = tmp_path / "bf16/iteration_00000002"
    assert not (it_dir / "metadata.json").exists()
    f = safe_open(str(it_dir / "p-model-0000000-0000001.safetensors"), "pt")
    for name, value in full.items():
        assert same_bits(f.get_tensor(name), value.to(torch.bfloat16)), name


@pytest.mark.parametrize(("broken", "expected"), [
    ({"drop_file": True}, ["a: chunk at offset [3, 0] is stored in", "b: chunk at offset [0, 4] is stored in"]),
    ({"second_row": 4}, ["a: chunk at [4, 0] of shape [3, 4] lies outside [6, 4]"]),
    ({"second_row": 2}, ["a: chunks at [0, 0] and [2, 0] overlap"]),
])
def test_broken_shards_are_listed_and_nothing_is_written(tmp_path, broken, expected):
    _sharded(tmp_path, **broken)
    with pytest.raises(ConversionError) as err:
        convert_bf16(tmp_path / "base/iteration_00000002", tmp_path / "bf16")
    for text in expected:
        assert any(p.startswith(text) for p in err.value.problems), (text, err.value.problems)
    assert not (tmp_path / "bf16").exists()
    assert not leftovers(tmp_path)


def test_duplicate_tensor_without_metadata_is_refused(tmp_path):
    it_dir = tmp_path / "base"
    it_dir.mkdir()
    save_file({"w": torch.ones(2)}, str(it_dir / "x-model-0000000-0000002.safetensors"))
    save_file({"w": torch.ones(2)}, str(it_dir / "x-model-0000001-0000002.safetensors"))
    with pytest.raises(ConversionError, match="Duplicate parameter_name"):
        convert_bf16(it_dir, tmp_path / "bf16")


def test_refuses_to_overwrite_and_cleans_up_after_a_failure(tmp_path):
    write_mindformers(tmp_path / "base", {"w": torch.ones(2)})
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConversionError, match="already exists"):
        convert_bf16(tmp_path / "base", tmp_path / "taken")
    file = tmp_path / "base/iteration_00000010/checkpoint-model-0000000-0000001.safetensors"
    file.write_bytes(file.read_bytes()[:-4])  # truncated: the header promises more bytes than the file has
    with pytest.raises(ConversionError, match=r"tensor 'w': data_offsets \[0, 8\] run past the end of the file"):
        convert_bf16(tmp_path / "base", tmp_path / "bf16")
    assert not (tmp_path / "bf16").exists()
    assert not leftovers(tmp_path)


@pytest.mark.integration  # importing MindSpore starts a process (lscpu)
def test_legacy_ckpt_through_mindspore_and_output_loads_in_mindspore(tmp_path):
    ms = pytest.importorskip("mindspore")
    g = np.random.default_rng(5)
    w = g.standard_normal((6, 4)).astype(np.float32)
    b = g.standard_normal(5).astype(np.float32)
    params = [{"name": "layer.weight", "data": ms.Tensor(w)},
              {"name": "layer.bf16", "data": ms.Tensor(b).astype(ms.bfloat16)},
              {"name": "adam_m.layer.weight", "data": ms.Tensor(np.zeros((6, 4), np.float32))},
              {"name": "layer.mlp.expert_bias", "data": ms.Tensor(b)}]
    ms.save_checkpoint(params, str(tmp_path / "net_rank_0-1_10.ckpt"))
    summary = convert_bf16(tmp_path / "net_rank_0-1_10.ckpt", tmp_path / "bf16")
    assert summary.dropped == ("adam_m.layer.weight",)
    file = tmp_path / "bf16/iteration_00000000/checkpoint-model-0000000-0000001.safetensors"
    f = safe_open(str(file), "pt")
    assert same_bits(f.get_tensor("layer.weight"), torch.from_numpy(w).to(torch.bfloat16))
    assert same_bits(f.get_tensor("layer.bf16"), torch.from_numpy(b).to(torch.bfloat16))
    assert same_bits(f.get_tensor("layer.mlp.expert_bias"), torch.from_numpy(b))
    # the NPU side reads the result: MindSpore's own safetensors loader gives the same values
    loaded = ms.load_checkpoint(str(file), format="safetensors")
    assert sorted(loaded) == ["layer.bf16", "layer.mlp.expert_bias", "layer.weight"]
    assert np.array_equal(loaded["layer.weight"].astype(ms.float32).asnumpy(),
                          torch.from_numpy(w).to(torch.bfloat16).float().numpy())
    assert loaded["layer.mlp.expert_bias"].dtype == ms.float32


def test_the_streaming_writer_is_strict_about_dtypes_unless_asked_to_cast(tmp_path):
    from alignflow.convert.tensor_io import StreamingSafetensorsWriter, TensorMeta, read_layout

    layout = [("w", TensorMeta((2, 3), torch.bfloat16))]
    fp32 = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    with StreamingSafetensorsWriter(tmp_path / "strict.safetensors", layout) as writer:
        with pytest.raises(ValueError, match=r"'w' is \[2, 3\] torch.float32, layout says \[2, 3\] torch.bfloat16"):
            writer.write("w", fp32)
        writer.write("w", fp32.to(torch.bfloat16))  # the layout's own dtype is written as is
    with StreamingSafetensorsWriter(tmp_path / "cast.safetensors", layout, cast=True) as writer:
        writer.write("w", fp32)
    assert read_layout(tmp_path / "cast.safetensors") == dict(layout)
    with safe_open(str(tmp_path / "cast.safetensors"), framework="pt") as handle:
        assert torch.equal(handle.get_tensor("w"), fp32.to(torch.bfloat16))
    # cast=True casts floating dtypes only: never an integer, never a shape
    for bad in (torch.zeros(2, 3, dtype=torch.int32), torch.zeros(3, 2)):
        with pytest.raises(ValueError, match="layout says"), \
                StreamingSafetensorsWriter(tmp_path / "bad.safetensors", layout, cast=True) as writer:
            writer.write("w", bad)
