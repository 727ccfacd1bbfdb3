"""Issue 45, item 4: every checkpoint reader fails closed. A truncated, emptied, missing or garbled file of any format
(MindFormers, Megatron legacy of one rank and of tp 2 x pp 2, torch_dist, DCP, Hugging Face of one file and sharded
with its index; every shard, one at a time) ends the conversion
with exit 1 and one line naming the file - never a library's traceback (a torch_dist checkpoint with a truncated
`.distcp` ended in `ValueError: negative seek value`; an emptied one in typer's bare "Aborted."), and nothing is
written. A config that contradicts the tensors is refused naming both; `compare` of a file that is not a text log
is exit 2.

What is not a damage a reader can see: bytes changed inside a tensor's data (only torch_dist's items carry CRC-32s,
those of their torch.save archives), and a
file a format may lack (a MindFormers `common.json`, a Hugging Face `config.json` or index).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from tests.convert.synthetic import source_state, write_mindformers
from tests.faults.conftest import staging_leftovers

pytestmark = pytest.mark.integration

runner = CliRunner()
SPEC = "qwen3"  # a family with a Hugging Face spec too (qwen3-hf): every format converts to and from it


def _invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One checkpoint of each format, of the same weights, converted by alignflow itself."""
    from alignflow.convert import load_spec
    from alignflow.convert.formats import convert_checkpoint

    root = tmp_path_factory.mktemp("formats")
    write_mindformers(root / "mindformers", source_state(SPEC))
    model = root / "model.json"
    model.write_text(json.dumps(load_spec(SPEC).model.model_dump(mode="json")))
    for args in (("megatron", "mindformers", "megatron", "--spec", SPEC),
                 ("megatron", "mindformers", "megatron_sharded", "--spec", SPEC, "--tp", "2", "--pp", "2"),
                 ("hf", "megatron", "hf", "--spec", SPEC, "--model", str(model)),
                 ("dcp", "hf", "dcp")):
        target, src, dst, *rest = args
        done = _invoke("convert", target, str(root / src), str(root / dst), *rest)
        assert done.exit_code == 0, done.output
    convert_checkpoint(root / "mindformers", root / "torch_dist", source="mindformers", target="torch_dist",
                       spec=SPEC)
    _shard_hf(root / "hf", root / "hf_sharded")
    return {p.name: p for p in root.iterdir() if p.is_dir()}


def _shard_hf(src: Path, dst: Path) -> None:
    """`src`'s tensors in two files and the index `save_pretrained` writes for a sharded checkpoint."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    shutil.copy(src / "config.json", dst)
    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:]), start=1):
        file = f"model-{i:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(dst / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _convert(fmt: str, src: Path, dst: Path) -> Any:
    """Read `src` (of `fmt`) through its reader: into Megatron's legacy format for MindFormers, else MindFormers."""
    if fmt == "mindformers":
        return _invoke("convert", "megatron", str(src), str(dst), "--spec", SPEC)
    fmt = fmt.removesuffix("_sharded")
    return _invoke("convert", "mindformers", str(src), str(dst), "--spec", SPEC, "--from", fmt)


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _garble_head(f: Path) -> None:
    f.write_bytes(b"\x13" * 64 + f.read_bytes()[64:])


DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "emptied": lambda f: f.write_bytes(b""),
    "missing": lambda f: f.unlink(),
    "garbled": _garble_head,
}

# Each format's files, by role: its tensor files (every shard of a sharded one) and its metadata.
FILES: dict[str, dict[str, str]] = {
    "mindformers": {"tensors": "iteration_*/*.safetensors", "metadata": "iteration_*/common.json"},
    "megatron": {"tensors": "iter_*/mp_rank_00/model_optim_rng.pt"},
    "megatron_sharded": {"tensors": "iter_*/mp_rank_*/model_optim_rng.pt"},  # tp 2 x pp 2
    "torch_dist": {"shard": "iter_*/__0_*.distcp", "metadata": "iter_*/.metadata", "common": "iter_*/common.pt",
                   "backend": "iter_*/metadata.json"},
    "hf": {"tensors": "model.safetensors", "config": "config.json"},
    "hf_sharded": {"tensors": "model-*.safetensors", "index": "model.safetensors.index.json"},
    "dcp": {"shard": "__0_0.distcp", "metadata": ".metadata"},
}
# A file a format may lack: the conversion is right without it.
OPTIONAL = {("mindformers", "metadata", "missing"), ("hf", "config", "missing"),
            ("hf_sharded", "index", "missing"),  # its shards are found by their names then
            ("torch_dist", "common", "missing")}  # megatron-core 0.19 keeps the common state in the DCP files
CASES = [(fmt, role, damage) for fmt, roles in FILES.items() for role in roles for damage in DAMAGES
         if (fmt, role, damage) not in OPTIONAL]


@pytest.mark.parametrize(("fmt", "role", "damage"), CASES, ids=["-".join(c) for c in CASES])
def test_a_damaged_file_of_any_format_is_exit_1_one_line_naming_it_and_nothing_written(
        checkpoints: dict[str, Path], tmp_path: Path, fmt: str, role: str, damage: str) -> None:
    src = tmp_path / fmt
    shutil.copytree(checkpoints[fmt], src)
    files = sorted(src.glob(FILES[fmt][role]))
    assert files, FILES[fmt][role]
    for file in files:  # every shard of the role, one at a time
        copy = tmp_path / f"{fmt}-{file.name}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(src, copy)
        victim = copy / file.relative_to(src)
        DAMAGES[damage](victim)
        out = tmp_path / f"{copy.name}-out"
        done = _convert(fmt, copy, out)
        assert done.exception is None or isinstance(done.exception, SystemExit), (victim, repr(done.exception))
        assert done.exit_code == 1, (victim, done.output)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, done.stderr
        # a missing file is named where its checkpoint says it must be (a shard), else by its directory
        named = str(victim.parent) if damage == "missing" else str(victim)
        assert named in errors[0], (named, done.stderr)
        assert done.stderr.strip() == errors[0], done.stderr  # one line
        assert not out.exists()
        assert staging_leftovers(tmp_path) == []


def _double(config: Path, *keys: str) -> None:
    doc = json.loads(config.read_text())
    for key in keys:
        doc[key] *= 2
    config.write_text(json.dumps(doc))


def test_a_hugging_face_config_that_contradicts_its_tensors_is_refused_naming_both(
        checkpoints: dict[str, Path], tmp_path: Path) -> None:
    src = tmp_path / "hf"
    shutil.copytree(checkpoints["hf"], src)
    _double(src / "config.json", "num_hidden_layers", "hidden_size")
    done = _convert("hf", src, tmp_path / "out")
    assert done.exit_code == 1, done.output
    assert f"{src / 'config.json'}: num_hidden_layers 4, but the tensors of model.safetensors hold 2 layers" \
        in done.stderr
    assert f"{src / 'config.json'}: hidden_size 128, but model.embed_tokens.weight in model.safetensors has " \
        "shape [256, 64]" in done.stderr
    assert not (tmp_path / "out").exists()


def test_megatron_args_that_contradict_the_tensors_are_refused_naming_both(checkpoints: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    import argparse

    import torch

    src = tmp_path / "megatron"
    shutil.copytree(checkpoints["megatron"], src)
    (file,) = src.glob("iter_*/mp_rank_00/model_optim_rng.pt")
    payload = torch.load(file, map_location="cpu", weights_only=True)
    payload["args"] = argparse.Namespace(num_layers=4, hidden_size=128)  # the checkpoint has 2 layers, width 64
    torch.save(payload, file)
    done = _convert("megatron", src, tmp_path / "out")
    assert done.exit_code == 1, done.output
    assert f"{file}: its args say num_layers 4, its tensors hold 2 layers" in done.stderr
    assert f"{file}: its args say hidden_size 128, its embedding.word_embeddings.weight is [256, 64]" in done.stderr
    assert not (tmp_path / "out").exists()


def test_compare_of_a_file_that_is_not_a_text_log_is_exit_2(tmp_path: Path) -> None:
    """The issue's case: the store (an SQLite file whose records hold log lines) compared as a Megatron log."""
    from tests.logfixtures import make_run, megatron_lines

    log = tmp_path / "gpu.log"
    log.write_text("\n".join(megatron_lines(make_run(10, seed=1))) + "\n")
    db = tmp_path / "store.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("create table tails (text)")
        con.executemany("insert into tails values (?)", [(line,) for line in log.read_text().splitlines()])
    done = _invoke("compare", str(log), str(db), "--ref-format", "megatron", "--test-format", "megatron",
                   "--out", str(tmp_path / "report"))
    assert done.exit_code == 2, done.output
    assert f"{db}: not a text log: binary content (an SQLite database)" in done.output
    assert not (tmp_path / "report").exists()
