"""Megatron torch_dist and many-rank legacy checkpoints, written and read through megatron-core's own sharding.

Every conversion here builds real megatron-core 0.16.1 GPTModels on `meta` (the layout planner runs in a process
of its own, hence `integration`); the proof that real GPTModels at tp 2 / pp 2 / ep 2 load what is written is
`test_megatron_core_dist.py`.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader

from alignflow.config.parallel import ParallelConfig
from alignflow.convert import convert_bf16, convert_to_megatron, convert_to_mindformers, load_spec
from alignflow.errors import ConversionError
from alignflow.fingerprint import sha256_of

from .synthetic import leftovers, read_mindformers, same_bits, source_state, write_mindformers

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

TP2_PP2_EP2 = ParallelConfig(tp=2, pp=2, ep=2, dp=2)


def _bf16(tmp_path: Path, name: str) -> Path:
    write_mindformers(tmp_path / "base", source_state(name, dtype=torch.float32))
    convert_bf16(tmp_path / "base", tmp_path / "bf16")
    return tmp_path / "bf16"


@pytest.mark.parametrize("name", ["twin-dense", "twin-moe", "twin-moe-bias"])
def test_torch_dist_round_trip_is_bit_exact(tmp_path: Path, name: str) -> None:
    bf16 = _bf16(tmp_path, name)
    summary = convert_to_megatron(bf16, tmp_path / "mg", spec=name, ckpt_format="torch_dist", workers=2)
    assert summary.ckpt_format == "torch_dist"
    files = set(summary.output_files)
    assert {"latest_checkpointed_iteration.txt", "iter_0000001/metadata.json", "iter_0000001/common.pt",
            "iter_0000001/.metadata"} <= files
    # DEFAULT_FILES of tensors (independent of the host's cores) and one of sharded objects
    assert sum(f.endswith(".distcp") for f in files) == 9
    meta = json.loads((tmp_path / "mg/iter_0000001/metadata.json").read_text())
    assert meta["sharded_backend"] == "torch_dist"
    common = torch.load(tmp_path / "mg/iter_0000001/common.pt", weights_only=True)
    assert common["checkpoint_version"] == 3.0
    assert common["content_metadata"] == {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    if name == "twin-moe-bias":  # fp32 in Megatron (`_maintain_float32_expert_bias`), fp32 in the checkpoint
        assert ("float32", 4) in summary.dtypes
    back = convert_to_mindformers(tmp_path / "mg", tmp_path / "back", spec=name)
    assert back.ckpt_format == "torch_dist"
    want, got = read_mindformers(bf16), read_mindformers(tmp_path / "back")
    assert set(got) == set(want)
    assert all(same_bits(got[k], want[k]) for k in want)


def test_the_same_conversion_writes_the_same_bytes_with_other_worker_counts_and_a_warm_layout_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from alignflow.convert import sharding

    monkeypatch.setenv("ALIGNFLOW_CACHE_DIR", str(tmp_path / "cache"))
    bf16 = _bf16(tmp_path, "twin-dense")
    model = load_spec("twin-dense").model
    assert sharding.cached_layout(model) is None
    convert_to_megatron(bf16, tmp_path / "a", spec="twin-dense", ckpt_format="torch_dist", workers=1)
    cached = sharding.cached_layout(model)  # the writers of the next conversion start before megatron-core loads
    assert cached is not None
    convert_to_megatron(bf16, tmp_path / "b", spec="twin-dense", ckpt_format="torch_dist", workers=3)
    assert sha256_of(tmp_path / "a") == sha256_of(tmp_path / "b")
    assert b"/a" not in (tmp_path / "a/iter_0000001/.metadata").read_bytes()  # no path of this host inside
    # a cache that lies (two tensors' places swapped): the plan disagrees, the writers start again from it
    (entry,) = (tmp_path / "cache" / "mcore-layouts").glob("*.json")
    data = json.loads(entry.read_text())
    tensors = data["ranks"][0]["tensors"]
    tensors[0][2], tensors[-1][2] = tensors[-1][2], tensors[0][2]
    entry.write_text(json.dumps(data))
    convert_to_megatron(bf16, tmp_path / "c", spec="twin-dense", ckpt_format="torch_dist", workers=2)
    assert sha256_of(tmp_path / "c") == sha256_of(tmp_path / "a")
    assert sharding.cached_layout(model) == cached  # and the cache is right again


def test_legacy_files_for_tp_pp_ep_hold_each_ranks_slice_and_read_back(tmp_path: Path) -> None:
    bf16 = _bf16(tmp_path, "twin-moe")
    summary = convert_to_megatron(bf16, tmp_path / "sh", spec="twin-moe", parallel=TP2_PP2_EP2)
    assert summary.ckpt_format is not None
    assert sorted(f.split("/")[1] for f in summary.output_files if f.endswith(".pt")) == [
        f"mp_rank_{t:02d}_{p:03d}_{e:03d}" for t in range(2) for p in range(2) for e in range(2)]
    last = torch.load(tmp_path / "sh/iter_0000001/mp_rank_01_001_001/model_optim_rng.pt", weights_only=True)
    model = last["model"]
    # stage 1 holds layers 2, 3 as 0, 1; expert rank 1 holds experts 2, 3 as 0, 1; tp rank 1 the second halves
    full = read_mindformers(bf16)
    qkv = model["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape == (128, 128)
    assert "decoder.layers.2.self_attention.linear_qkv.weight" not in model
    assert {k for k in model if ".local_experts." in k and k.startswith("decoder.layers.1.") and
            k.endswith(".weight")} == {
        f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc{n}.weight" for e in (0, 1) for n in (1, 2)}
    assert model["embedding.word_embeddings.weight"].shape == (128, 128)  # MTP's copy on the last stage
    assert torch.equal(model["embedding.word_embeddings.weight"], full["embedding.word_embeddings.weight"][128:])
    assert model["decoder.layers.0.self_attention.linear_proj._extra_state"] is None
    back = convert_to_mindformers(tmp_path / "sh", tmp_path / "back", spec="twin-moe")
    assert dict(back.parallel) == {"tp": 2, "pp": 2, "ep": 2}
    got = read_mindformers(tmp_path / "back")
    assert set(got) == set(full)
    assert all(same_bits(got[k], full[k]) for k in full)


def test_legacy_files_of_a_later_megatron_name_the_mtp_layer_as_it_does(tmp_path: Path) -> None:
    bf16 = _bf16(tmp_path, "twin-moe")
    convert_to_megatron(bf16, tmp_path / "sh", spec="twin-moe", parallel=ParallelConfig(pp=2),
                        megatron_version="0.19")
    model = torch.load(tmp_path / "sh/iter_0000001/mp_rank_00_001/model_optim_rng.pt", weights_only=True)["model"]
    assert any(k.startswith("mtp.layers.0.mtp_model_layer.") for k in model)
    assert not any(".transformer_layer." in k for k in model)
    convert_to_mindformers(tmp_path / "sh", tmp_path / "back", spec="twin-moe")  # read back in either naming
    want, got = read_mindformers(bf16), read_mindformers(tmp_path / "back")
    assert set(got) == set(want)
    assert all(same_bits(got[k], want[k]) for k in want)


def test_a_missing_rank_file_or_tensor_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    bf16 = _bf16(tmp_path, "twin-dense")
    convert_to_megatron(bf16, tmp_path / "sh", spec="twin-dense", parallel=ParallelConfig(tp=2))
    shutil.rmtree(tmp_path / "sh/iter_0000001/mp_rank_01")
    (tmp_path / "sh/iter_0000001/mp_rank_01").mkdir()
    with pytest.raises(ConversionError, match=r"mp_rank_01/model_optim_rng.pt: missing \(rank tp 1"):
        convert_to_mindformers(tmp_path / "sh", tmp_path / "back", spec="twin-dense")
    assert not (tmp_path / "back").exists()
    assert leftovers(tmp_path) == []
    convert_to_megatron(bf16, tmp_path / "td", spec="twin-dense", ckpt_format="torch_dist")
    meta = FileSystemReader(str(tmp_path / "td/iter_0000001")).read_metadata()
    # a dense model's layers are one global tensor per name, stacked on a prepended layer axis
    del meta.state_dict_metadata["decoder.layers.mlp.linear_fc2.weight"]
    (tmp_path / "td/iter_0000001/.metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(ConversionError, match=r"missing tensor 'decoder.layers.mlp.linear_fc2.weight' \[4, 128, 256\]"):
        convert_to_mindformers(tmp_path / "td", tmp_path / "back", spec="twin-dense")
    assert leftovers(tmp_path) == []


def test_a_spec_whose_names_megatron_core_does_not_have_is_refused(tmp_path: Path) -> None:
    spec = load_spec("twin-dense")
    renamed = [r.model_copy(update={"target": "self_attention.linear_qkv.weight_renamed"})
               if r.target == "self_attention.linear_qkv.weight" else r for r in spec.layer_rules]
    wrong = spec.model_copy(update={"name": "twin-dense-renamed", "layer_rules": renamed})
    bf16 = _bf16(tmp_path, "twin-dense")
    with pytest.raises(ConversionError) as err:
        convert_to_megatron(bf16, tmp_path / "td", spec=wrong, ckpt_format="torch_dist")
    text = str(err.value)
    assert "megatron-core's GPTModel has no tensor 'decoder.layers.0.self_attention.linear_qkv.weight_renamed'" in text
    assert "has 'decoder.layers.0.self_attention.linear_qkv.weight', which no rule of the spec writes" in text
    assert not (tmp_path / "td").exists()
    assert leftovers(tmp_path) == []


def test_a_writer_process_that_fails_fails_the_conversion_and_leaves_nothing(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from alignflow.convert import engine

    bf16 = _bf16(tmp_path, "twin-dense")
    real = engine.apply_chain

    def fails_on_the_output_layer(ops, xs):  # the writers are forked: they run this process's code
        if xs and tuple(xs[0].shape) == (256, 128) and len(ops) == 0:
            raise OSError("disk went away")
        return real(ops, xs)

    monkeypatch.setattr(engine, "apply_chain", fails_on_the_output_layer)
    with pytest.raises(ConversionError, match="OSError: disk went away"):
        convert_to_megatron(bf16, tmp_path / "td", spec="twin-dense", ckpt_format="torch_dist", workers=2)
    assert not (tmp_path / "td").exists()
    assert leftovers(tmp_path) == []


def test_cli_writes_torch_dist_and_refuses_a_layout_for_it(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    bf16 = _bf16(tmp_path, "twin-dense")
    base = [sys.executable, "-m", "alignflow", "convert", "megatron", str(bf16)]
    ok = subprocess.run([*base, str(tmp_path / "td"), "--spec", "twin-dense", "--ckpt-format", "torch_dist", "--json"],
                        env=subprocess_env, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["ckpt_format"] == "torch_dist"
    bad = subprocess.run([*base, str(tmp_path / "x"), "--spec", "twin-dense", "--ckpt-format", "torch_dist", "--tp",
                          "2"], env=subprocess_env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2
    assert "a torch_dist checkpoint loads at any layout" in bad.stderr
    cannot = subprocess.run([*base, str(tmp_path / "y"), "--spec", "twin-dense", "--tp", "3"], env=subprocess_env,
                            capture_output=True, text=True, timeout=600)
    assert cannot.returncode == 1, cannot.stderr[-2000:]
    assert "layout planning failed" in cannot.stderr
    assert not (tmp_path / "y").exists()


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(entry.name))
    return out


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_an_interrupted_torch_dist_conversion_leaves_nothing_and_no_writer(tmp_path: Path, sig: str,
                                                                             subprocess_env: dict[str, str]) -> None:
    import os
    import signal
    import time

    from alignflow.config.model import ModelConfig

    # large enough (0.6 GB) that the writers are still at work when the signal comes
    model = ModelConfig(family="twin-dense", num_layers=4, hidden_size=1024, ffn_hidden_size=4096,
                        num_attention_heads=8, num_query_groups=4, kv_channels=128, vocab_size=131072, seq_length=32)
    write_mindformers(tmp_path / "bf16", source_state("twin-dense", model, seed=3))
    (tmp_path / "model.json").write_text(model.model_dump_json())
    proc = subprocess.Popen([sys.executable, "-m", "alignflow", "convert", "megatron", str(tmp_path / "bf16"),
                             str(tmp_path / "td"), "--spec", "twin-dense", "--model", str(tmp_path / "model.json"),
                             "--ckpt-format", "torch_dist", "--workers", "2"], env=subprocess_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writers: set[int] = set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # until the writers are at work
        writers |= _children(proc.pid)
        if any(p.suffix == ".distcp" and p.stat().st_size > 0 for p in tmp_path.glob(".td.*.partial/*/*")):
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    writers |= _children(proc.pid)
    assert writers, "no writer process seen"
    proc.send_signal(getattr(signal, sig))
    proc.wait(timeout=120)  # not communicate(): the writers hold the pipes open as long as they live

    def alive() -> list[int]:
        return [p for p in writers if Path(f"/proc/{p}").exists() and "zombie" not in
                Path(f"/proc/{p}/status").read_text().lower()]

    gone = time.monotonic() + 0.1  # the kernel kills them with the converter; finishing a file takes longer
    while alive() and time.monotonic() < gone:
        time.sleep(0.02)
    left = alive()
    for pid in left:  # a failing run leaves no writer behind either
        os.kill(pid, signal.SIGKILL)
    assert left == []  # killed by the converter, or by the kernel with it (parent-death signal)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (130 if sig == "SIGINT" else -9), err[-2000:]
    assert not (tmp_path / "td").exists()
    if sig == "SIGINT":
        assert "interrupted" in err
        assert leftovers(tmp_path) == []
