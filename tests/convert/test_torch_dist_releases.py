"""torch_dist conversions under every checked megatron-core release (each in its own interpreter, the release on
PYTHONPATH: `python -m alignflow.frameworks.megatron_installs install` puts them under `.venv/megatron-core`, `make
test` does it): each writes the same global tensors - keys, shapes, dtypes, MTP included (0.17 renamed the MTP inner
layer's module, not its checkpoint keys) - and reads its own checkpoint back bit-exact. Megatron-LM of any checked
release is then given the same checkpoint, whichever release converted it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader

from alignflow.convert import convert_bf16, convert_to_megatron
from alignflow.frameworks.megatron_installs import DEFAULT_DIR, python_path, releases

from .synthetic import read_mindformers, same_bits, source_state, write_mindformers

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

REPO = Path(__file__).resolve().parents[2]


# The two conversions of one release, in one interpreter: `alignflow.cli.main` (the `alignflow` command's entry point)
# run once per command line; the first that does not exit 0 ends the interpreter with its code.
DRIVER = """
import json, sys
from alignflow.cli import main
for argv in json.loads(sys.argv[1]):
    sys.argv = ["alignflow", *argv]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
"""


def _convert(bf16: Path, dst: Path, env: dict[str, str]) -> None:
    commands = [["convert", *argv, "--spec", "twin-moe"] for argv in (
        ["megatron", str(bf16), str(dst / "td"), "--ckpt-format", "torch_dist", "--workers", "2"],
        ["mindformers", str(dst / "td"), str(dst / "back")])]
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(commands)], env=env, capture_output=True,
                          text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def _tensors(td: Path) -> dict[str, Any]:
    meta = FileSystemReader(str(td / "iter_0000001")).read_metadata().state_dict_metadata
    return {k: (tuple(m.size), m.properties.dtype) for k, m in meta.items() if hasattr(m, "size")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("releases")
    write_mindformers(root / "base", source_state("twin-moe", dtype=torch.float32))
    convert_bf16(root / "base", root / "bf16")
    with pytest.MonkeyPatch.context() as mp:  # the installed release, in this process: a cold layout cache
        mp.setenv("ALIGNFLOW_CACHE_DIR", str(root / "cache-installed"))
        convert_to_megatron(root / "bf16", root / "installed" / "td", spec="twin-moe", ckpt_format="torch_dist",
                            workers=2)
    return {"root": root, "tensors": _tensors(root / "installed" / "td")}


@pytest.mark.parametrize("release", releases())
def test_every_release_writes_the_same_tensors_and_reads_them_back(installed: dict[str, Any], release: str,
                                                                    subprocess_env: dict[str, str]) -> None:
    where = REPO / DEFAULT_DIR
    if not (where / release).is_dir():
        pytest.skip(f"megatron-core {release} is not installed under {DEFAULT_DIR} (python -m "
                    "alignflow.frameworks.megatron_installs install)")
    root: Path = installed["root"]
    env = {**subprocess_env, "ALIGNFLOW_CACHE_DIR": str(root / f"cache-{release}"),
           "PYTHONPATH": os.pathsep.join([python_path(release, where), str(REPO)])}
    _convert(root / "bf16", root / release, env)
    got = _tensors(root / release / "td")
    assert any(".mtp." in k or k.startswith("mtp.") for k in got)
    assert got == installed["tensors"]
    want, back = read_mindformers(root / "bf16"), read_mindformers(root / release / "back")
    assert set(back) == set(want)
    for name, tensor in want.items():
        assert same_bits(back[name], tensor), name
