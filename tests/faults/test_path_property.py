"""Property (issue 16): over a local host and an SSH lab host, for random names and random symlink graphs inside
and across the workdir boundary, every path operation either acts on the right bytes or fails - with
`PathNotAllowed` whenever the path, or a link below it, leads out of the workdir - and nothing outside the
workdir is read or written.

Names mix spaces, quotes, `$`, backticks, newlines, backslashes and non-ASCII; links are absolute or relative
and point at files and directories inside the example, outside the workdir, at nothing, or at an ancestor. The
oracle is computed here, independently of alignflow: what a reader of the tree would see, following links.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from alignflow.errors import AlignflowError, PathNotAllowed
from alignflow.transport import copy_between
from tests.faults.conftest import SECRET, Site

pytestmark = pytest.mark.integration

# Per transport; each example builds a tree and runs two operations on it (~1-2 s). The suite runs the same
# examples every time (derandomized): a property test that draws new ones on each run can fail CI at random.
# Drawing at random found a file named `*` copied wrong, now an explicit example below. To hunt, draw N new
# examples at random: `ALIGNFLOW_PROPERTY_EXAMPLES=400 pytest tests/faults/test_path_property.py -x`.
HUNT = int(os.environ.get("ALIGNFLOW_PROPERTY_EXAMPLES", "0"))
EXAMPLES = HUNT or 10

NAME_CHARS = ["a", "b", " ", "'", '"', "$", "`", "\n", "\\", "é", "数", "🙂", "-", "*", ";", "#", "{", "}", "~"]
names = st.text(alphabet=st.sampled_from(NAME_CHARS), min_size=1, max_size=6).filter(
    lambda n: n not in (".", "..") and not n.startswith("~"))

TARGETS = ["inside-file", "inside-dir", "outside-file", "outside-dir", "dangling-inside", "dangling-outside",
           "ancestor"]
OPERATIONS = ["sha256", "get", "copy", "read", "write", "remove"]


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[str, int, str, str, bool]]:
    """Nodes (kind, parent index, name, link target kind, relative link): parents are earlier directories."""
    nodes: list[tuple[str, int, str, str, bool]] = []
    dirs = [0]  # index 0 is the example's root directory
    for _ in range(draw(st.integers(2, 9))):
        kind = draw(st.sampled_from(["file", "file", "dir", "link", "link"]))
        parent = draw(st.sampled_from(dirs))
        nodes.append((kind, parent, draw(names), draw(st.sampled_from(TARGETS)), draw(st.booleans())))
        if kind == "dir":
            dirs.append(len(nodes))
    return nodes


@dataclass
class Example:
    site: Site
    root: Path  # the example's directory (local path)
    paths: list[Path]  # every node's path, index 0 = root
    outside_shas: set[str]

    def rel(self, p: Path) -> str:
        return str(p.relative_to(self.site.workdir))


def _build(site: Site, nodes: list[tuple[str, int, str, str, bool]]) -> Example:
    ex = f"ex-{secrets.token_hex(8)}"
    root = site.root / ex
    root.mkdir()
    site.own(root)
    paths = [root]
    files, dirs = [], [root]
    pending_links = []
    for kind, parent, name, target, relative in nodes:
        path = paths[parent] / name
        while path.exists() or path.is_symlink() or path in paths:
            path = path.with_name(path.name + "_")
        paths.append(path)
        if kind == "file":
            path.write_bytes((secrets.token_hex(8) + name).encode())  # text: read_text reads it too
            files.append(path)
        elif kind == "dir":
            path.mkdir()
            dirs.append(path)
        else:
            pending_links.append((path, target, relative))
    for path, target, relative in pending_links:
        dest = {
            "inside-file": files[len(files) // 2] if files else root / "missing",
            "inside-dir": dirs[-1],
            "outside-file": site.outside / "private.txt",
            "outside-dir": site.outside / "keys",
            "dangling-inside": root / "nothing-here",
            "dangling-outside": site.outside / "nothing-there",
            "ancestor": path.parent,
        }[target]
        path.symlink_to(os.path.relpath(dest, path.parent) if relative else dest)
    site.own(root)
    return Example(site, root, paths, {hashlib.sha256(p.read_bytes()).hexdigest()
                                       for p in site.outside.rglob("*") if p.is_file()})


def _inside(real: str, workdir: str) -> bool:
    return real == workdir or real.startswith(workdir + "/")


def _oracle(path: Path, workdir: str) -> tuple[str, dict[str, bytes]]:
    """("escape" | "broken" | "ok", {relative path: content}) of what reading `path`, links followed, meets."""
    real = os.path.realpath(path)
    if not _inside(real, workdir):
        return "escape", {}
    if not os.path.exists(path):
        return "broken", {}
    if os.path.isfile(path):
        return "ok", {"": Path(real).read_bytes()}
    content: dict[str, bytes] = {}
    verdict = "ok"

    def walk(d: Path, rel: str, seen: frozenset[str]) -> None:
        nonlocal verdict
        for entry in sorted(os.listdir(d)):
            full = d / entry
            r = os.path.realpath(full)
            if full.is_symlink() and not _inside(r, workdir):
                verdict = "escape"
            elif not os.path.exists(full):
                verdict = "broken" if verdict == "ok" else verdict
            elif os.path.isdir(full):
                if r in seen:
                    verdict = "broken" if verdict == "ok" else verdict
                else:
                    walk(full, f"{rel}{entry}/", seen | {r})
            else:
                content[f"{rel}{entry}"] = Path(r).read_bytes()

    walk(path, "", frozenset({real}))
    return verdict, content


def _tree(path: Path) -> dict[str, bytes]:
    """Files of a copy (which must hold no links), by relative path."""
    if path.is_file():
        return {"": path.read_bytes()}
    out = {}
    for p in path.rglob("*"):
        assert not p.is_symlink(), f"a copy holds a link: {p}"
        if p.is_file():
            out[str(p.relative_to(path))] = p.read_bytes()
    return out


def _check(ex: Example, op: str, target: Path, tmp: Path) -> None:
    t, workdir = ex.site.t, os.path.realpath(ex.site.workdir)
    verdict, content = _oracle(target, workdir)
    if op in ("write", "remove"):  # they act on the path itself, never read what lies below it
        verdict = "escape" if not _inside(os.path.realpath(target), workdir) else "ok"
    rel = ex.rel(target)
    try:
        if op == "sha256":
            fp = t.sha256([rel])[rel]
            got = {f.path: f.sha256 for f in fp.files} if fp.kind == "dir" else {"": fp.sha256}
            assert got == {k: hashlib.sha256(v).hexdigest() for k, v in content.items()}
            assert not set(got.values()) & ex.outside_shas
        elif op == "get":
            local = tmp / f"got-{secrets.token_hex(8)}"
            t.get(rel, str(local))
            assert _tree(local) == content
        elif op == "copy":
            dst = f"{ex.site.area}/copy-{secrets.token_hex(8)}"
            copy_between(t, rel, t, dst)
            assert _tree(ex.site.workdir / dst) == content
        elif op == "read":
            if verdict == "ok" and "" not in content:
                return  # a directory: not what read_text reads
            assert t.read_text(rel).encode() == content[""]
        elif op == "write":
            where = f"{rel}/new \"'$`\n"
            path = t.write_text(where, "written")
            assert verdict == "ok"
            assert _inside(os.path.realpath(path), workdir)
            assert Path(os.path.realpath(path)).read_text() == "written"
            return
        elif op == "remove":
            t.remove(rel, recursive=True)
            assert verdict == "ok"
            assert not target.is_symlink()
            assert not target.exists()
            return
    except PathNotAllowed:
        assert verdict == "escape", (op, rel, verdict)
        return
    except AlignflowError as exc:
        failure: AlignflowError | None = exc
    else:
        failure = None
    # a broken tree (dangling link, loop) fails - so may an escaping one whose walk meets a broken link first, and
    # a write into what is not a directory; never a success, never bytes from outside
    if failure is not None:
        assert verdict != "ok" or (op == "write" and not os.path.isdir(target)), (op, rel, verdict, failure)
        return
    assert verdict == "ok", (op, rel, verdict, "succeeded")


ESCAPING_FILE_LINK = [("file", 0, "w", "inside-file", False), ("link", 0, "leak", "outside-file", False)]
ESCAPING_DIR_LINK = [("dir", 0, "sub dir", "inside-dir", False), ("link", 1, "keys", "outside-dir", True)]


@pytest.mark.parametrize("site", ["local", "ssh"], indirect=True)
@settings(max_examples=EXAMPLES, deadline=None, database=None, report_multiple_bugs=False, derandomize=not HUNT,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: an example is cheap to read, slow to shrink
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(nodes=trees(), ops=st.lists(st.sampled_from(OPERATIONS), min_size=2, max_size=2),
       picks=st.lists(st.integers(0, 99), min_size=2, max_size=2))
# the escapes of issue 16, item 1, always among the examples: a link out of the workdir inside a directory
@example(nodes=ESCAPING_FILE_LINK, ops=["sha256", "copy"], picks=[0, 0])
@example(nodes=ESCAPING_DIR_LINK, ops=["get", "remove"], picks=[0, 0])
# rsync -s expanded a remote source named `*` into its whole directory (drawn at random once)
@example(nodes=[("link", 0, "l", "outside-file", False), ("file", 0, "*", "outside-file", True),
                ("file", 0, "c\\*d", "outside-file", True)], ops=["get", "get"], picks=[2, 3])
def test_every_path_operation_acts_on_the_right_bytes_or_is_refused(site: Site, tmp_path: Path,
                                                                    nodes: list[tuple[str, int, str, str, bool]],
                                                                    ops: list[str], picks: list[int]) -> None:
    ex = _build(site, nodes)
    before = site.outside_snapshot()
    outside_names = sorted(str(p) for p in site.outside.rglob("*"))
    for op, pick in sorted(zip(ops, picks, strict=True), key=lambda item: item[0] == "remove"):  # removal last
        target = ex.paths[pick % len(ex.paths)]
        if not (target.exists() or target.is_symlink()):
            continue
        _check(ex, op, target, tmp_path)
        assert site.outside_snapshot() == before, f"{op} changed a file outside the workdir"
        assert sorted(str(p) for p in site.outside.rglob("*")) == outside_names, f"{op} created a file outside"
    assert SECRET not in b"".join(b for p in site.root.rglob("*") if p.is_file() and not p.is_symlink()
                                  for b in [p.read_bytes()])
