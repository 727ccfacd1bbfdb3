"""Every checked megatron-core release, installed side by side for the checks of `megatron_build`.

    python -m alignflow.frameworks.megatron_installs install [DIR]     # default DIR: .venv/megatron-core
    python -m alignflow.frameworks.megatron_installs path VERSION [DIR] # the PYTHONPATH that imports that release

Each release of `megatron_versions.CHECKED_RELEASES` goes into `DIR/<release>` with `pip install --no-deps
--ignore-requires-python --target` (0.17.1 and later declare Python >= 3.12, yet PyPI has their cp311 wheels, and
`megatron_build` shims the one 3.12 name they import, `typing.override`), and triton, which megatron-core 0.18+
imports unconditionally (`megatron/core/transformer/moe/paged_stash.py`) without declaring it, into `DIR/triton`
(it imports on a CPU; none of its kernels runs). Their other requirements (torch, numpy, packaging) are the
venv's. A stamp file per directory makes a second run a no-op; `make test` runs `install` (Makefile).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from alignflow.frameworks.megatron_versions import CHECKED_RELEASES

DEFAULT_DIR = Path(".venv") / "megatron-core"
TRITON = "triton==3.9.0"
_STAMP = ".alignflow-installed"


def releases() -> list[str]:
    """Every checked release, oldest first."""
    return [r for series in CHECKED_RELEASES.values() for r in series]


def _pip_target(requirement: str, target: Path) -> None:
    stamp = target / _STAMP
    if stamp.is_file() and stamp.read_text() == requirement:
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--ignore-requires-python", "--upgrade", "--target", str(target), requirement], check=True)
    (target / _STAMP).write_text(requirement)


def install(root: Path = DEFAULT_DIR) -> list[Path]:
    """Install every checked release and triton under `root`; returns their directories."""
    root.mkdir(parents=True, exist_ok=True)
    done = []
    for release in releases():
        _pip_target(f"megatron-core=={release}", root / release)
        done.append(root / release)
    _pip_target(TRITON, root / "triton")
    return [*done, root / "triton"]


def python_path(release: str, root: Path = DEFAULT_DIR) -> str:
    """The PYTHONPATH entries that make `import megatron.core` give `release` (with triton beside it)."""
    if release not in releases():
        raise ValueError(f"megatron-core {release} is not a checked release ({', '.join(releases())})")
    here = root / release
    if not (here / _STAMP).is_file():
        raise FileNotFoundError(f"{here}: not installed; run `python -m alignflow.frameworks.megatron_installs "
                                "install` (make test does)")
    return os.pathsep.join([str(here.resolve()), str((root / "triton").resolve())])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m alignflow.frameworks.megatron_installs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="install every checked release side by side")
    i.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    p = sub.add_parser("path", help="print the PYTHONPATH of one release")
    p.add_argument("release")
    p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR)
    args = ap.parse_args(argv)
    if args.cmd == "install":
        for path in install(args.dir):
            sys.stdout.write(f"{path}\n")
    else:
        sys.stdout.write(python_path(args.release, args.dir) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
