"""The one preflight check that contacts a host: is Megatron-LM where a Megatron side's `entry` says, as declared?

A host without Megatron-LM at `<side>.entry` would otherwise be found out when the side's training starts — after the
base training and the conversions, hours in. Before step 1, a short probe runs with the host's Python (over the
host's transport, with its env and setup lines) and reports: `gpu.entry` is an absolute path to a file; beside it
is a Megatron-LM tree (`megatron/training/arguments.py`, `megatron/core/package_info.py`); that tree's
megatron-core version equals `gpu.megatron_version` in every part the declaration gives (`0.19` takes any 0.19.x,
`0.19.0` only 0.19.0: flags, NullTokenizer, the converted checkpoint and the checked Megatron code all follow it);
the host's Python has torch, Transformer Engine when the experiment asks for its implementation, and every extension
the experiment counts on (`<side>.extensions`, from hosts.yaml's `cuda_extensions`), `fast_hadamard_transform` where
DSA's indexer rotates its activations, and with TE the TE and cuDNN versions: a pair known to fail in fused attention
(`FUSED_ATTENTION_FAILURES`) is refused unless the rendered `--attention-backend` avoids it. On an Ascend host
(MindSpeed): torch_npu and the MindSpeed package whose adaptor patches Megatron, and an entry that imports
`mindspeed_llm.megatron_adaptor` itself unless `<side>.adaptor` names one. Only for sides of `kind: megatron`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from alignflow.backends.template import MegatronArgs
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host
from alignflow.config.placement import Placement
from alignflow.frameworks.ascend import MINDSPEED_ADAPTOR, MINDSPEED_LLM_ADAPTOR
from alignflow.frameworks.megatron_versions import TE
from alignflow.pipeline import SIDES, Side

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
if req.get("kernels"):  # what decides the attention kernels: Transformer Engine's and cuDNN's versions
    from importlib import metadata
    for dist in ("transformer_engine", "transformer-engine", "transformer_engine_cu13", "transformer_engine_cu12"):
        try:
            out["te_version"] = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            pass
    try:
        import torch
        out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception as exc:
        out["cudnn_error"] = f"{type(exc).__name__}: {exc}"
adaptor = r"^\s*(from\s+mindspeed_llm\s+import\s+megatron_adaptor|import\s+mindspeed_llm\.megatron_adaptor)"
out["imports_adaptor"] = bool(out["entry"] and re.search(adaptor, open(entry, encoding="utf-8",
                                                                         errors="replace").read(), re.M))
print(json.dumps(out))
'''


def check_megatron_hosts(experiment: Experiment, placement: Placement, transport_factory: Callable[[Host], Any], *,
                         sides: Collection[Side] | None = None) -> dict[Side, list[str]]:
    """Problems of the hosts (of `placement`) of `experiment`'s real Megatron sides (on a GPU host, or MindSpeed on
    an Ascend host; of `sides`, default both), by side (an empty list: Megatron-LM is there as declared); sides of
    other backends are not probed."""
    from alignflow.backends.commands import step_command, train_spec
    from alignflow.backends.registry import side_backend
    from alignflow.backends.template import MegatronArgs

    found: dict[Side, list[str]] = {}
    for s in SIDES:
        if sides is not None and s.name not in sides:
            continue
        host = placement.host(s.training)
        template = step_command(experiment, s.training, data_sha256="", host=host).template
        train = train_spec(experiment, s.training, s.name, experiment.training.steps, None, None, data_sha256="",
                           host=host)
        args = side_backend(experiment, s.name).settings(experiment, train, template)
        if isinstance(args, MegatronArgs) and args.real and args.entry is not None:
            found[s.name] = check_megatron_host(s.name, args, host, transport_factory,
                                                te=getattr(experiment.side(s.name), "transformer_impl", "local")
                                                == "transformer_engine")
    return found


def check_megatron_host(side_name: Side, args: MegatronArgs, host: Host, transport_factory: Callable[[Host], Any],
                        *, te: bool = False) -> list[str]:
    """Problems of `host` for one Megatron side rendered as `args` (empty: Megatron-LM is there as declared)."""
    from alignflow.errors import AlignflowError

    assert args.entry is not None
    npu = args.role == "ascend"
    wanted = ["torch", *(args.extensions or ())]
    if npu:  # torch_npu, and the MindSpeed package whose adaptor patches Megatron
        wanted += ["torch_npu", (args.adaptor or MINDSPEED_LLM_ADAPTOR).split(".")[0]]
    if te and TE not in wanted:
        wanted.append(TE)
    if _flag(args.argv, "--experimental-attention-variant") == "dsa" and \
            "--no-dsa-indexer-rotate-activation" not in args.argv:
        wanted.append(HADAMARD)  # DSA's indexer rotates its activations with it on every forward (0.19's default)
    where = f"host {host.name}"
    transport = transport_factory(host)
    try:
        done = transport.run([transport.python(), "-c", PROBE, json.dumps({"entry": args.entry, "modules": wanted,
                                                                           "kernels": te and not npu})],
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
    problems = _problems(found, where=where, entry=args.entry, version=args.megatron_version, wanted=wanted,
                         extensions=args.extensions, side=side_name)
    problems += attention_kernel_problems(found, where=where, backend=_flag(args.argv, "--attention-backend"),
                                          side=side_name)
    if npu and args.adaptor is None and found.get("entry") and not found.get("imports_adaptor"):
        problems.append(f"{where}: {args.entry} does not import {MINDSPEED_LLM_ADAPTOR} (MindSpeed-LLM's "
                        f"pretrain_gpt.py does): a plain Megatron-LM entry on an NPU host needs {side_name}.adaptor "
                        f"({MINDSPEED_ADAPTOR})")
    return problems


HADAMARD = "fast_hadamard_transform"
# Transformer Engine x cuDNN pairs whose fused attention is known to fail, with what was seen: preflight refuses a
# `--attention-backend` that may pick it (fused, auto) on such a host, naming the pair.
FUSED_ATTENTION_FAILURES: dict[tuple[str, int], str] = {
    ("2.17.1", 91900): "cuDNN Error: ... CUDNN_STATUS_BAD_PARAM in fused_attn_bwd, the first backward of qwen35_dense "
                       "and qwen35_moe on an H100 (issue 50)",
}


def _flag(argv: Sequence[str], name: str) -> str | None:
    """The value of `name` in a Megatron command line (the last one given), None when absent."""
    found = None
    for i, token in enumerate(argv):
        if token == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif token.startswith(name + "="):
            found = token.split("=", 1)[1]
    return found


def attention_kernel_problems(found: dict[str, Any], *, where: str, backend: str | None, side: str) -> list[str]:
    """A TE x cuDNN pair known to fail in fused attention, on a host whose rendered backend may pick it."""
    te, cudnn = found.get("te_version"), found.get("cudnn")
    if te is None or cudnn is None:
        return []
    seen = FUSED_ATTENTION_FAILURES.get((str(te).split("+")[0], int(cudnn)))
    if seen is None or backend in ("unfused", "flash", "local"):
        return []
    return [f"{where}: Transformer Engine {te} with cuDNN {cudnn} fails in fused attention ({seen}), and "
            f"--attention-backend {backend or 'auto'} may pick it: set {side}.attention_backend: unfused"]


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
              extensions: Sequence[str] | None = None, side: str = "gpu") -> list[str]:
    if not found["absolute"]:
        return [f"{where}: {side}.entry {entry!r} must be an absolute path (the job runs in its own output directory)"]
    if not found["entry"]:
        return [f"{where}: {side}.entry {entry} does not exist: no Megatron-LM pretrain_gpt.py there (clone "
                f"Megatron-LM at core_v{version}.0 there, or point {side}.entry at the checkout's pretrain_gpt.py)"]
    problems = []
    if not found["arguments"]:
        problems.append(f"{where}: {entry} is not in a Megatron-LM checkout (no megatron/training/arguments.py "
                        "beside it)")
    have = found["version"]
    if have is None:
        problems.append(f"{where}: no megatron/core/package_info.py beside {entry}: the megatron-core version is "
                        f"unknown ({side}.megatron_version says {version})")
    elif not same_version(have, version):
        problems.append(f"{where}: the Megatron-LM beside {entry} is megatron-core {have}, but "
                        f"{side}.megatron_version is {version}: flags, NullTokenizer, the converted checkpoint and "
                        f"the Megatron code alignflow checked follow the version (set {side}.megatron_version to the "
                        "host's, or check out the declared release there)")
    for name in wanted:
        if not found["modules"].get(name):
            declared = name in (extensions or ())
            what = ("needed by pretrain_gpt.py" if name in ("torch", "torch_npu") else
                    f"{side}.transformer_impl transformer_engine" if name == TE and not declared else
                    f"declared in cuda_extensions ({side}.extensions)" if declared else
                    "MindSpeed, whose adaptor runs Megatron on the NPU")
            problems.append(f"{where}: its Python has no {name} ({what})")
    return problems
