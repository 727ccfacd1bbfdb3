"""`run_mindformer.py --config X.yaml --mode 1` for the MindFormers CPU lab.

    python -m alignflow.labs.mindformers_cpu.launcher --config X.yaml --mode 1

The wheel of MindFormers 2.1.0 has no `run_mindformer.py` (it lives in the source repository). With `--mode 1`
that script does `mindformers.pynative.trainer.Trainer(config).train()` and nothing else — it ignores every
other flag and never sets the device (https://github.com/mindspore-lab/mindformers/blob/master/run_mindformer.py).
This launcher does the same after the lab's two patches (`kernels.install`, `hyper_parallel_standin.install`),
which must run before MindFormers is imported. Graph mode (`--mode 0`) is not part of the lab.

Exit codes: 0 = trained; 1 = MindFormers raised (its traceback is printed, as `run_mindformer.py` prints it);
2 = the lab cannot run here (MindFormers missing or not 2.1.0, a real hyper_parallel installed, bad usage).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from alignflow.frameworks.mindspore_host import run_host_tasks_inline
from alignflow.labs.mindformers_cpu import REQUIRED_MINDFORMERS


class LabUnavailable(RuntimeError):
    """The CPU lab cannot run on this host; the message says what it needs."""


def installed_mindformers() -> str | None:
    """The installed MindFormers version, or None (read from the distribution metadata: importing MindFormers
    creates `./output/log` and takes seconds)."""
    from importlib import metadata

    try:
        return metadata.version("mindformers")
    except metadata.PackageNotFoundError:
        return None


def check_mindformers() -> None:
    """Raise `LabUnavailable` unless MindFormers `REQUIRED_MINDFORMERS` is installed."""
    version = installed_mindformers()
    if version is None:
        raise LabUnavailable(f"the MindFormers CPU lab needs mindformers=={REQUIRED_MINDFORMERS}, which is not "
                             "installed; install the `mindformers-cpu` extra and then `pip install --no-deps "
                             f"mindformers=={REQUIRED_MINDFORMERS}` (`make venv` does both)")
    if version != REQUIRED_MINDFORMERS:
        raise LabUnavailable(f"the MindFormers CPU lab needs mindformers=={REQUIRED_MINDFORMERS}, found {version}: "
                             "its kernel replacements and hyper_parallel stand-in are written against that "
                             "version's trainer")


def prepare() -> None:
    """Check the version and install both patches (before MindFormers is imported)."""
    check_mindformers()
    from alignflow.labs.mindformers_cpu import hyper_parallel_standin, kernels

    try:
        hyper_parallel_standin.install()
    except hyper_parallel_standin.HyperParallelUnavailable as exc:
        raise LabUnavailable(str(exc)) from None
    kernels.install()
    # MindFormers builds its dataset helpers (helpers.cpp) on first use with a Makefile that runs
    # `python3 -m pybind11`: that must be this interpreter, whose environment has pybind11
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    run_host_tasks_inline()  # MindSpore on a CPU host (alignflow.frameworks.mindspore_host)
    import mindspore

    # Synchronous op launch: the same numbers (checked: identical loss lines), but ~25x faster on a 2-core host,
    # where PyNative's asynchronous launch pipeline costs more than these tiny kernels (3.5 s vs 0.14 s a step).
    mindspore.runtime.launch_blocking()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alignflow.labs.mindformers_cpu.launcher", allow_abbrev=False,
                                     description="run_mindformer.py --mode 1 on a CPU host (MindFormers 2.1.0).")
    parser.add_argument("--config", required=True, help="MindFormers PyNative training YAML")
    parser.add_argument("--mode", type=int, default=1, help="1 = PyNative (the only mode of the lab)")
    args = parser.parse_args(argv)
    if args.mode != 1:
        sys.stderr.write(f"launcher: --mode {args.mode}: the MindFormers CPU lab runs PyNative only (--mode 1)\n")
        return 2
    try:
        prepare()
    except LabUnavailable as exc:
        sys.stderr.write(f"launcher: {exc}\n")
        return 2
    from mindformers.pynative.trainer import Trainer

    try:
        Trainer(config=args.config).train()
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
