"""The one preflight check that contacts a host: is Megatron-LM where `gpu.entry` says, as declared?

A GPU host without Megatron-LM at `gpu.entry` would otherwise be found out when gpu_train starts — after the NPU
base training and both conversions, hours in. Before step 1, a short probe runs with the host's Python (over the
host's transport, with its env and setup lines) and reports: `gpu.entry` is an absolute path to a file; beside it
is a Megatron-LM tree (`megatron/training/arguments.py`, `megatron/core/package_info.py`); that tree's
megatron-core version equals `gpu.megatron_version` in every part the declaration gives (`0.19` takes any 0.19.x,
`0.19.0` only 0.19.0: flags, NullTokenizer, the converted checkpoint and the checked Megatron code all follow it);
the host's Python has torch, Transformer Engine when the experiment asks for its implementation, and every extension
the experiment counts on (`gpu.extensions`, from hosts.yaml's `cuda_extensions`). Only for `gpu.kind: megatron`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host
from alignflow.frameworks.megatron_versions import TE

PROBE = r'''
import importlib.util, json, os, re, sys
req = json.loads(sys.argv[1])
entry = req["entry"]
root = os.path.dirname(entry)
out = {"absolute": os.path.isabs(entry), "entry": os.path.isfile(entry),
       "arguments": os.path.isfile(os.path.join(root, "megatron", "training", "arguments.py")),
       "version": None, "modules": {}}
info = os.path.join(root, "megatron", "core", "package_info.py")
if os.path.isfile(info):
    text = open(info, encoding="utf-8", errors="replace").read()
    parts = [re.search(r"^%s\s*=\s*(\d+)" % k, text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    if all(parts):
        out["version"] = ".".join(p.group(1) for p in parts)
for name in req["modules"]:
    try:
        out["modules"][name] = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        out["modules"][name] = False
print(json.dumps(out))
'''


def check_gpu_host(experiment: Experiment, host: Host, transport_factory: Callable[[Host], Any]) -> list[str]:
    """Problems of `host`, where `experiment`'s gpu_train runs (empty: Megatron-LM is there as declared)."""
    entry = experiment.gpu.entry
    if experiment.gpu.kind != "megatron" or entry is None:
        return []
    from alignflow.errors import AlignflowError

    gpu = experiment.gpu
    wanted = ["torch", *(gpu.extensions or ())]
    if gpu.transformer_impl == "transformer_engine" and TE not in wanted:
        wanted.append(TE)
    where = f"host {host.name}"
    transport = transport_factory(host)
    try:
        done = transport.run([transport.python(), "-c", PROBE, json.dumps({"entry": entry, "modules": wanted})],
                             check=False, timeout_s=120)
    except AlignflowError as exc:
        return [f"{where}: cannot probe for Megatron-LM: {exc}"]
    finally:
        close = getattr(transport, "close", None)
        if close is not None:
            close()
    if done.exit_code != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return [f"{where}: {transport.python()} could not run the probe (exit {done.exit_code}): {tail}"]
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [f"{where}: unreadable probe output {done.stdout[-200:]!r}"]
    return _problems(found, where=where, entry=entry, version=gpu.megatron_version, wanted=wanted,
                     extensions=gpu.extensions)


def same_version(have: str, declared: str) -> bool:
    """Does the host's megatron-core `have` (MAJOR.MINOR.PATCH) equal `declared` in every part `declared` gives?"""
    from alignflow.convert.layout import MegatronVersionError, parse_version

    try:
        parse_version(declared)
    except MegatronVersionError:
        return False
    parts = declared.strip().removeprefix("core_v").removeprefix("v").split(".")
    numbers = [p for p in parts if p.isdigit()]
    return have.split(".")[:len(numbers)] == numbers and len(numbers) == len(parts)


def _problems(found: dict[str, Any], *, where: str, entry: str, version: str, wanted: list[str],
              extensions: Sequence[str] | None = None) -> list[str]:
    if not found["absolute"]:
        return [f"{where}: gpu.entry {entry!r} must be an absolute path (the job runs in its own output directory)"]
    if not found["entry"]:
        return [f"{where}: gpu.entry {entry} does not exist: no Megatron-LM pretrain_gpt.py there (clone Megatron-LM "
                f"at core_v{version}.0 there, or point gpu.entry at the checkout's pretrain_gpt.py)"]
    problems = []
    if not found["arguments"]:
        problems.append(f"{where}: {entry} is not in a Megatron-LM checkout (no megatron/training/arguments.py "
                        "beside it)")
    have = found["version"]
    if have is None:
        problems.append(f"{where}: no megatron/core/package_info.py beside {entry}: the megatron-core version is "
                        f"unknown (gpu.megatron_version says {version})")
    elif not same_version(have, version):
        problems.append(f"{where}: the Megatron-LM beside {entry} is megatron-core {have}, but gpu.megatron_version "
                        f"is {version}: flags, NullTokenizer, the converted checkpoint and the Megatron code alignflow "
                        "checked follow the version (set gpu.megatron_version to the host's, or check out the "
                        "declared release there)")
    for name in wanted:
        if not found["modules"].get(name):
            declared = name in (extensions or ())
            what = ("needed by pretrain_gpt.py" if name == "torch" else "gpu.transformer_impl transformer_engine"
                    if name == TE and not declared else "declared in cuda_extensions (gpu.extensions)")
            problems.append(f"{where}: its Python has no {name} ({what})")
    return problems
