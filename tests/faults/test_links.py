"""Issue 16, item 1: links inside an artifact directory never carry bytes from outside the host's workdir.

A checkpoint directory holding `leak -> ~/private.txt` used to be hashed with the private file's content and
copied, with it, host to host and to the controller (`rsync -L`, a fingerprint that follows links). Each
operation is checked on a local host and on an SSH lab host (real sshd, its own Unix user).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.errors import PathNotAllowed
from alignflow.fingerprint import fingerprint
from alignflow.transport import copy_between
from tests.faults.conftest import SECRET, Site, staging_leftovers, tree_bytes

pytestmark = pytest.mark.integration


def _checkpoint(site: Site, name: str = "ckpt") -> str:
    site.write(f"{name}/latest_checkpointed_iteration.txt", b"10")
    site.write(f"{name}/iteration_00000010/model.safetensors", b"weights" * 100)
    return f"{site.area}/{name}"


@pytest.mark.parametrize("target", ["private.txt", "keys"], ids=["file-link", "dir-link"])
def test_an_inner_link_out_of_the_workdir_is_refused_by_hash_and_every_copy(site: Site, tmp_path: Path,
                                                                              target: str) -> None:
    ckpt = _checkpoint(site)
    site.link("ckpt/iteration_00000010/leak", site.outside / target)
    before = site.outside_snapshot()
    with pytest.raises(PathNotAllowed, match="leak"):
        site.t.sha256([ckpt])
    with pytest.raises(PathNotAllowed, match="leak"):
        copy_between(site.t, ckpt, site.t, f"{site.area}/copy")
    with pytest.raises(PathNotAllowed, match="leak"):
        site.t.get(ckpt, str(tmp_path / "fetched"))
    assert not (site.root / "copy").exists()
    assert not (tmp_path / "fetched").exists()
    assert staging_leftovers(site.root) == []
    assert staging_leftovers(tmp_path) == []
    assert site.outside_snapshot() == before


def test_a_link_planted_after_the_artifact_was_recorded_is_refused_when_it_is_copied(site: Site,
                                                                                    tmp_path: Path) -> None:
    """A copy given the recorded fingerprint does not hash the source again; it still checks its links."""
    ckpt = _checkpoint(site)
    recorded = site.t.sha256([ckpt])[ckpt]
    (site.root / "ckpt" / "iteration_00000010" / "model.safetensors").unlink()
    site.link("ckpt/iteration_00000010/model.safetensors", site.outside / "private.txt")
    with pytest.raises(PathNotAllowed, match=r"model\.safetensors"):
        copy_between(site.t, ckpt, site.t, f"{site.area}/copy", expected=recorded)
    with pytest.raises(PathNotAllowed):
        copy_between(site.t, ckpt, site.another(), f"{site.area}/copy2", expected=recorded)
    assert not (site.root / "copy").exists()
    assert not (site.root / "copy2").exists()
    assert staging_leftovers(site.root) == []


def test_links_that_stay_inside_the_workdir_are_followed(site: Site, tmp_path: Path) -> None:
    ckpt = _checkpoint(site)
    site.write("shared/vocab.json", b'{"a": 1}')
    site.link("ckpt/vocab.json", site.root / "shared" / "vocab.json")  # absolute, inside
    site.link("ckpt/latest", "iteration_00000010")  # relative, inside the checkpoint
    fp = site.t.sha256([ckpt])[ckpt]
    assert {f.path for f in fp.files} >= {"vocab.json", "latest/model.safetensors"}
    back = site.t.get(ckpt, str(tmp_path / "back"))
    assert back == fp == fingerprint(tmp_path / "back")
    assert (tmp_path / "back" / "vocab.json").read_bytes() == b'{"a": 1}'
    assert not (tmp_path / "back" / "vocab.json").is_symlink()  # a copy holds content, never links


def test_removing_a_directory_with_an_escaping_link_removes_the_link_not_its_target(site: Site) -> None:
    ckpt = _checkpoint(site)
    site.link("ckpt/leak", site.outside / "private.txt")
    site.link("ckpt/keys", site.outside / "keys")
    before = site.outside_snapshot()
    site.t.remove(ckpt, recursive=True)
    assert not (site.root / "ckpt").exists()
    assert site.outside_snapshot() == before
    assert (site.outside / "keys" / "id_ed25519").exists()


def test_a_staged_copy_never_follows_a_link(site: Site) -> None:
    """The destination's own hash (which runs while a copy arrives) refuses a link instead of reading through it."""
    root = f"{site.area}/incoming"
    follower = site.t.follow_sha256(root)
    site.write("incoming/a.bin", b"arrived")
    site.link("incoming/leak", site.outside / "private.txt")
    with pytest.raises(Exception, match="symbolic link in a staged copy"):
        follower.result()


def test_host_to_host_copy_refuses_an_escaping_link(ssh_lab, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SSH host -> another SSH host (the relay and the direct route both start from the source's check)."""
    from alignflow.transport import open_transport

    src_host = ssh_lab.hosts["ascend"]
    area = tmp_path.name[:20]
    ckpt = src_host.workdir / area / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "w.bin").write_bytes(b"w" * 1000)
    (ckpt / "leak").symlink_to(src_host.home / ".ssh" / "authorized_keys")
    site = Site("ssh", None, src_host.workdir, area, src_host.home, src_host.uid,  # type: ignore[arg-type]
                src_host.workdir.stat().st_gid)
    site.own(src_host.workdir / area)
    with open_transport(ssh_lab.host("ascend")) as src, open_transport(ssh_lab.host("cpu")) as dst:
        for route in ("relay", "direct"):
            with pytest.raises(PathNotAllowed, match="leak"):
                copy_between(src, f"{area}/ckpt", dst, f"{area}/ckpt-{route}", route=route)  # type: ignore[arg-type]
    cpu_root = ssh_lab.hosts["cpu"].workdir / area
    assert not cpu_root.exists() or all(SECRET not in b for b in tree_bytes(cpu_root))
    assert staging_leftovers(cpu_root) == []
