"""`alignflow.controller`: the process table read from /proc (a directory of the same shape here)."""

from __future__ import annotations

from pathlib import Path

from alignflow.controller import descendants


def _proc(root: Path, parents: dict[int, int]) -> Path:
    for pid, ppid in parents.items():
        (root / str(pid)).mkdir(parents=True)
        # a command name with spaces and parentheses: the fields are counted after its last ')'
        (root / str(pid) / "stat").write_text(f"{pid} (py (x) y) S {ppid} {pid} {pid} 0 -1 4194304\n")
    (root / "self").mkdir()
    return root


def test_descendants_are_every_process_below_children_first(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20})
    assert descendants(10, proc) == [11, 12, 13]
    assert descendants(13, proc) == []
    assert sorted(descendants(1, proc)) == [10, 11, 12, 13, 20, 21]
