"""Fingerprints: file digests are hashlib's, directory digests follow the manifest, the memo skips unchanged files."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow import fingerprint as fpmod
from alignflow.cli import app
from alignflow.fingerprint import (
    BUFFER_BYTES,
    FileChangedError,
    Fingerprint,
    Fingerprinter,
    HashMemo,
    sha256_file_uncached,
    sha256_of,
)

OLD_NS = 1_600_000_000 * 10**9  # 2020: far outside the memo's racy window


def _write(path: Path, data: bytes, *, mtime_ns: int | None = OLD_NS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        _write(root / rel, data)
    return root


FILES = {
    "config.json": b'{"hidden_size": 64}\n',
    "iter_0000010/mp_rank_00/model_optim_rng.pt": bytes(range(256)) * 300,
    "iter_0000010/common.json": b"{}",
    "latest_checkpointed_iteration.txt": b"10",
    "empty.bin": b"",
}


# --- files --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4095, BUFFER_BYTES, BUFFER_BYTES + 1, 2 * BUFFER_BYTES + 12345])
def test_file_digest_equals_hashlib(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = _write(tmp_path / "f.bin", data)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_file_uncached(path) == expected
    assert sha256_of(path) == expected
    fp = Fingerprinter().fingerprint(path)
    assert (fp.kind, fp.sha256, fp.size, fp.files) == ("file", expected, size, ())


def test_small_buffers_cross_read_boundaries_without_changing_the_digest(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    path = _write(tmp_path / "f.bin", data)
    for buffer_bytes in (1, 7, 4096, 9999, 10_000, 10_001):
        assert sha256_file_uncached(path, buffer_bytes=buffer_bytes) == hashlib.sha256(data).hexdigest()


# --- directories --------------------------------------------------------------------------------------------------


def test_directory_digest_is_the_sha256_of_the_sorted_manifest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "ckpt", FILES)
    fp = Fingerprinter().fingerprint(root)
    rows = sorted([rel, hashlib.sha256(data).hexdigest(), len(data)] for rel, data in FILES.items())
    canonical = json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode()
    assert fp.kind == "dir"
    assert fp.sha256 == hashlib.sha256(canonical).hexdigest()
    assert fp.size == sum(len(d) for d in FILES.values())
    assert [[f.path, f.sha256, f.size] for f in fp.files] == rows
    assert Fingerprint.from_json(fp.to_json()) == fp


def test_directory_digest_does_not_depend_on_creation_order_or_times(tmp_path: Path) -> None:
    a = tmp_path / "a"
    for i, (rel, data) in enumerate(FILES.items()):
        _write(a / rel, data, mtime_ns=OLD_NS + i)
    b = tmp_path / "b"
    for i, (rel, data) in enumerate(reversed(list(FILES.items()))):
        _write(b / rel, data, mtime_ns=OLD_NS + 10**12 * (i + 1))
    assert Fingerprinter().fingerprint(a).sha256 == Fingerprinter().fingerprint(b).sha256


def test_parallel_and_serial_hashing_agree(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", {f"shard_{i:03d}.bin": os.urandom(1000 + i) for i in range(40)})
    assert Fingerprinter(workers=1).fingerprint(root) == Fingerprinter(workers=4).fingerprint(root)


@pytest.mark.parametrize("offset", [0, 1000, -1])
def test_changing_any_byte_changes_the_directory_digest(tmp_path: Path, offset: int) -> None:
    root = _tree(tmp_path / "d", FILES)
    before = Fingerprinter().fingerprint(root).sha256
    target = root / "iter_0000010/mp_rank_00/model_optim_rng.pt"
    data = bytearray(target.read_bytes())
    data[offset] ^= 0x01
    _write(target, bytes(data), mtime_ns=None)
    assert Fingerprinter().fingerprint(root).sha256 != before


def test_a_rename_changes_the_directory_digest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    before = Fingerprinter().fingerprint(root).sha256
    (root / "config.json").rename(root / "config2.json")
    assert Fingerprinter().fingerprint(root).sha256 != before


def test_moving_a_file_to_another_subdirectory_changes_the_digest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    before = Fingerprinter().fingerprint(root).sha256
    (root / "iter_0000010/common.json").rename(root / "iter_0000010/mp_rank_00/common.json")
    assert Fingerprinter().fingerprint(root).sha256 != before


@pytest.mark.parametrize("name", ["extra.txt", "iter_0000010/extra_empty", "z/deep/new.bin"])
def test_an_added_file_changes_the_directory_digest_even_an_empty_one(tmp_path: Path, name: str) -> None:
    root = _tree(tmp_path / "d", FILES)
    before = Fingerprinter().fingerprint(root).sha256
    _write(root / name, b"" if "empty" in name else b"x")
    assert Fingerprinter().fingerprint(root).sha256 != before


def test_a_removed_file_changes_the_directory_digest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    before = Fingerprinter().fingerprint(root).sha256
    (root / "empty.bin").unlink()
    assert Fingerprinter().fingerprint(root).sha256 != before


def test_empty_directories_are_not_part_of_the_manifest(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    before = Fingerprinter().fingerprint(root).sha256
    (root / "logs" / "empty").mkdir(parents=True)
    assert Fingerprinter().fingerprint(root).sha256 == before


def test_symlinked_files_and_directories_are_hashed_by_content(tmp_path: Path) -> None:
    real = _tree(tmp_path / "real", FILES)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "config.json").symlink_to(real / "config.json")
    (linked / "iter_0000010").symlink_to(real / "iter_0000010", target_is_directory=True)
    (linked / "latest_checkpointed_iteration.txt").symlink_to(real / "latest_checkpointed_iteration.txt")
    (linked / "empty.bin").symlink_to(real / "empty.bin")
    assert Fingerprinter().fingerprint(linked) == Fingerprinter().fingerprint(real)


def test_a_dangling_symlink_is_an_error_not_an_omission(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    (root / "broken").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="broken: dangling symbolic link"):
        Fingerprinter().fingerprint(root)


def test_a_symlink_loop_is_an_error(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    (root / "iter_0000010" / "up").symlink_to(root, target_is_directory=True)
    with pytest.raises(OSError, match="symbolic link loop"):
        Fingerprinter().fingerprint(root)


def test_a_fifo_inside_a_directory_is_an_error(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    os.mkfifo(root / "pipe")
    with pytest.raises(OSError, match="pipe: not a regular file"):
        Fingerprinter().fingerprint(root)


def test_a_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        Fingerprinter().fingerprint(tmp_path / "missing")


def test_a_file_that_changes_while_it_is_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A writer racing the reader cannot be timed deterministically, so the write happens inside the read call
    # (the real reader runs; only the moment of the concurrent append is forced).
    path = _write(tmp_path / "growing.log", b"step 1\n")
    real_reader = fpmod.sha256_file_uncached

    def reader_with_concurrent_append(p: str | Path, **kw: int) -> str:
        digest = real_reader(p, **kw)
        with open(p, "ab") as fh:
            fh.write(b"step 2\n")
        return digest

    monkeypatch.setattr(fpmod, "sha256_file_uncached", reader_with_concurrent_append)
    memo = HashMemo(tmp_path / "memo.sqlite")
    with pytest.raises(FileChangedError, match=r"growing\.log: changed while being hashed"):
        Fingerprinter(memo).fingerprint(path)
    monkeypatch.undo()
    fp = Fingerprinter(memo)
    assert fp.file(path) == hashlib.sha256(b"step 1\nstep 2\n").hexdigest()
    assert fp.hashed_bytes == 14  # nothing of the moving target was memoized
    memo.close()


# --- memo ---------------------------------------------------------------------------------------------------------


def test_memo_hit_after_no_change_reads_no_bytes(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", FILES)
    memo_path = tmp_path / "memo.sqlite"
    first = Fingerprinter(HashMemo(memo_path))
    expected = first.fingerprint(root)
    assert first.hashed_bytes == sum(len(d) for d in FILES.values())
    assert first.hashed_files == len(FILES)
    second = Fingerprinter(HashMemo(memo_path))  # a new memo connection: what another process would see
    assert second.fingerprint(root) == expected
    assert (second.hashed_bytes, second.hashed_files) == (0, 0)


@pytest.mark.integration
def test_memo_is_shared_between_processes(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    root = _tree(tmp_path / "d", FILES)
    memo_path = tmp_path / "memo.sqlite"
    out = subprocess.run(
        [sys.executable, "-m", "alignflow.fingerprint", str(root), "--json", "--memo", str(memo_path)],
        env=subprocess_env, capture_output=True, text=True, check=True,
    )
    fp = Fingerprinter(HashMemo(memo_path))
    assert fp.fingerprint(root).sha256 == json.loads(out.stdout)[str(root)]
    assert fp.hashed_bytes == 0


def test_memo_miss_after_touch_rereads_and_gives_the_same_digest(tmp_path: Path) -> None:
    path = _write(tmp_path / "w.bin", b"weights" * 100)
    memo = HashMemo(tmp_path / "memo.sqlite")
    digest = Fingerprinter(memo).file(path)
    os.utime(path, ns=(OLD_NS + 10**9, OLD_NS + 10**9))
    again = Fingerprinter(memo)
    assert again.file(path) == digest
    assert again.hashed_bytes == 700


def test_memo_miss_after_edit_gives_the_new_digest(tmp_path: Path) -> None:
    path = _write(tmp_path / "w.bin", b"weights-1")
    memo = HashMemo(tmp_path / "memo.sqlite")
    Fingerprinter(memo).file(path)
    _write(path, b"weights-22", mtime_ns=OLD_NS + 5 * 10**9)
    again = Fingerprinter(memo)
    assert again.file(path) == hashlib.sha256(b"weights-22").hexdigest()
    assert again.hashed_bytes == 10


def test_same_size_edit_with_restored_mtime_is_still_detected(tmp_path: Path) -> None:
    # `rsync -t`, `touch -d` or `cp -p` can put the old mtime back; the inode's ctime cannot be set by anyone.
    path = _write(tmp_path / "config.yaml", b"seed: 1\n")
    memo = HashMemo(tmp_path / "memo.sqlite")
    Fingerprinter(memo).file(path)
    time.sleep(0.01)  # let the ctime clock tick past the first write
    _write(path, b"seed: 2\n", mtime_ns=OLD_NS)
    again = Fingerprinter(memo)
    assert again.file(path) == hashlib.sha256(b"seed: 2\n").hexdigest()
    assert again.hashed_bytes == 8


def test_a_file_hashed_right_after_its_last_write_is_not_trusted_from_the_memo(tmp_path: Path) -> None:
    # git's "racy clean" rule: within one timestamp tick a same-size rewrite leaves every stat field unchanged.
    path = _write(tmp_path / "fresh.bin", b"abc", mtime_ns=None)
    memo = HashMemo(tmp_path / "memo.sqlite")
    Fingerprinter(memo).file(path)
    again = Fingerprinter(memo)
    again.file(path)
    assert again.hashed_bytes == 3
    os.utime(path, ns=(OLD_NS, OLD_NS))  # the file is now long at rest (and its ctime moved: one more read)
    Fingerprinter(memo).file(path)
    at_rest = Fingerprinter(memo)
    assert at_rest.file(path) == hashlib.sha256(b"abc").hexdigest()
    assert at_rest.hashed_bytes == 0


def test_memo_of_an_older_layout_is_rebuilt(tmp_path: Path) -> None:
    memo_path = tmp_path / "memo.sqlite"
    conn = sqlite3.connect(memo_path)
    conn.execute("CREATE TABLE memo (path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, size INTEGER,"
                 " mtime_ns INTEGER, sha256 TEXT NOT NULL)")
    conn.commit()
    conn.close()
    path = _write(tmp_path / "f", b"x")
    memo = HashMemo(memo_path)
    Fingerprinter(memo).file(path)
    again = Fingerprinter(memo)
    assert again.file(path) == hashlib.sha256(b"x").hexdigest()
    assert again.hashed_bytes == 0


# --- command lines ------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_module_cli_prints_json_digests_and_manifests(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    root = _tree(tmp_path / "d", FILES)
    single = root / "config.json"
    cmd = [sys.executable, "-m", "alignflow.fingerprint", str(root), str(single), "--json", "--no-memo"]
    out = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {str(root): sha256_of(root), str(single): sha256_of(single)}
    out = subprocess.run([*cmd, "--manifest"], env=subprocess_env, capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert Fingerprint.from_json(data[str(root)]) == Fingerprinter().fingerprint(root)
    assert data[str(single)] == {"kind": "file", "sha256": sha256_of(single), "size": len(FILES["config.json"])}


@pytest.mark.integration
def test_module_cli_reports_a_missing_path_and_still_prints_the_others(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    good = _write(tmp_path / "good", b"1")
    cmd = [sys.executable, "-m", "alignflow.fingerprint", str(tmp_path / "gone"), str(good), "--json", "--no-memo"]
    out = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert out.stderr.startswith(f"error: {tmp_path / 'gone'}: no such file or directory")
    assert json.loads(out.stdout) == {str(good): hashlib.sha256(b"1").hexdigest()}


def test_alignflow_hash_json_maps_each_path_to_its_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIGNFLOW_HASH_MEMO", str(tmp_path / "memo.sqlite"))
    root = _tree(tmp_path / "d", FILES)
    single = root / "iter_0000010" / "common.json"
    result = CliRunner().invoke(app, ["hash", str(root), str(single), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {str(root): sha256_of(root), str(single): hashlib.sha256(b"{}").hexdigest()}
    assert (tmp_path / "memo.sqlite").exists()


@pytest.mark.integration
def test_alignflow_hash_plain_output_is_sha256sum_style(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIGNFLOW_HASH_MEMO", str(tmp_path / "memo.sqlite"))
    path = _write(tmp_path / "a.bin", b"abc")
    result = CliRunner().invoke(app, ["hash", str(path)])
    assert result.exit_code == 0
    assert result.stdout == f"{hashlib.sha256(b'abc').hexdigest()}  {path}\n"
    check = subprocess.run(["sha256sum", "--check", "-"], input=result.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.integration
def test_alignflow_hash_exits_1_naming_the_missing_path(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    env = {**subprocess_env, "ALIGNFLOW_HASH_MEMO": str(tmp_path / "memo.sqlite")}
    out = subprocess.run(
        [sys.executable, "-m", "alignflow", "hash", str(tmp_path / "gone"), "--json"],
        env=env, capture_output=True, text=True, check=False,
    )
    assert out.returncode == 1
    assert out.stderr.startswith(f"error: {tmp_path / 'gone'}: no such file or directory")  # like every error
    assert json.loads(out.stdout) == {}
