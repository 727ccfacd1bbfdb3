"""Multi-process launchers generated from the experiment's layout and the host: torchrun and msrun.

A training of `tp * pp * dp` processes (`alignflow.config.parallel`) runs on the host's nodes, `world / nodes`
per node (at most the host's `devices` per node). One process: the plain command, as before. More:

- **torchrun** (Megatron, the PyTorch twin): `--nproc_per_node P --nnodes N`; on one node `--standalone`, on
  several the c10d rendezvous at the allocation's first node (`scontrol show hostnames $SLURM_JOB_NODELIST`),
  `PET_RDZV_ENDPOINT` / `PET_RDZV_ID` set per job and one torchrun per node through `srun`. Every rank's output is
  kept under `{out}/rank_logs` (`--log_dir`, `--redirects 3`) and teed to the job's stdout prefixed with the
  global rank (`TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[${rank}]:`), which `alignflow.logs` groups by rank.
- **msrun** (MindFormers): `--worker_num W --local_worker_num P --master_port --log_dir {out}/msrun_log`; on
  several nodes `--master_addr` (the first node) and `--node_rank $SLURM_NODEID`, one msrun per node via `srun`.
  Each rank writes `msrun_log/worker_<rank>.log`.

Which rank's log is compared: the last one (the last pipeline stage). Megatron prints the losses only there
(`print_rank_last`), MindFormers prints `loss: N/A` on the other stages; see `alignflow.logs.parse`.
torchrun flags: https://docs.pytorch.org/docs/stable/elastic/run.html; msrun: the MindSpore msrun guide
(https://www.mindspore.cn/docs/en/master/model_train/parallel/msrun_launcher.html).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from alignflow.config.hosts import Host
from alignflow.config.parallel import ParallelConfig
from alignflow.errors import ConfigError

RANK_LOGS = "rank_logs"
MSRUN_LOGS = "msrun_log"
RDZV_PORT = 29500
# torchrun's per-line prefix with the global rank (torch >= 2.2 reads it from the environment)
PREFIX_ENV = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]:"}
_SWITCHES = frozenset({"standalone", "no_python", "no-python", "run_path", "run-path"})

_FIRST_NODE = 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) && [ -n "$head" ] || ' \
              '{ echo "alignflow: no Slurm allocation to launch on (SLURM_JOB_NODELIST is empty)" >&2; exit 1; }\n'
_SRUN = 'exec srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 '


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one training's processes run: `nodes` x `per_node`, with its parallel sizes."""

    parallel: ParallelConfig
    nodes: int = 1
    per_node: int = 1
    slurm: bool = False  # inside a Slurm allocation: several nodes are reached with srun

    @property
    def world(self) -> int:
        return self.nodes * self.per_node


def layout_for(parallel: ParallelConfig, host: Host | None, *, side: str) -> Layout:
    """The layout of a `parallel` training on `host` (None: rendered without a host, all on one node)."""
    world = parallel.world_size
    if host is None:
        return Layout(parallel, 1, world)
    nodes = host.nodes
    if world % nodes:
        raise ConfigError(f"{side} layout tp {parallel.tp} x pp {parallel.pp} x dp {parallel.dp} = {world} process(es) "
                          f"cannot spread evenly over host {host.name}'s {nodes} nodes (slurm.nodes)")
    per_node = world // nodes
    if per_node > host.devices_per_node:
        raise ConfigError(f"{side} layout tp {parallel.tp} x pp {parallel.pp} x dp {parallel.dp} = {world} process(es) "
                          f"needs {per_node} per node on host {host.name}, which has {host.devices_per_node} "
                          "(hosts.yaml devices, or slurm.gpus_per_node)")
    return Layout(parallel, nodes, per_node, host.scheduler == "slurm")


def _check_options(given: Mapping[str, Any], owned: Mapping[str, Any], launcher: str) -> None:
    for key, value in owned.items():
        for spelling in (key, key.replace("_", "-")):
            if spelling in given and str(given[spelling]) != str(value):
                raise ConfigError(f"{launcher} option {spelling}={given[spelling]} contradicts the layout "
                                  f"({key}={value} from the parallel sizes and the host); drop it")


def _flags(options: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in options.items():
        if value is True and key in _SWITCHES:
            out.append(f"--{key}")
        elif value is not False and value is not None:
            out += [f"--{key}", str(value)]
    return out


def torchrun(layout: Layout, program: Sequence[str], options: Mapping[str, Any] | None = None
             ) -> tuple[list[str], dict[str, str]]:
    """argv and env of `program` (the entry and its flags) under torchrun; the plain program for one process
    without torchrun options."""
    given = dict(options or {})
    if layout.world == 1:  # one process: as the experiment's own torchrun options say, or none
        launcher = ["{python}", "-m", "torch.distributed.run", *_flags(dict(sorted(given.items())))] if given else \
            ["{python}"]
        return [*launcher, *program], {}
    owned: dict[str, Any] = {"nproc_per_node": layout.per_node, "nnodes": layout.nodes}
    _check_options(given, owned, "gpu.torchrun")
    opts: dict[str, Any] = dict(owned)
    if layout.nodes == 1:
        opts["standalone"] = True
    else:
        opts["rdzv_backend"] = "c10d"  # endpoint and id: PET_RDZV_* from the allocation (see `_slurm_torchrun`)
    opts |= {"log_dir": f"{{out}}/{RANK_LOGS}", "redirects": 3, "tee": 3}
    opts |= {k: v for k, v in given.items() if k.replace("-", "_") not in owned}
    if layout.nodes > 1:
        opts.pop("master_port", None)
    argv = ["{python}", "-m", "torch.distributed.run", *_flags(opts), *program]
    return (_slurm_torchrun(argv, given) if layout.nodes > 1 else argv), dict(PREFIX_ENV)


def _slurm_torchrun(argv: list[str], given: Mapping[str, Any]) -> list[str]:
    port = int(given.get("master_port", RDZV_PORT))
    script = (_FIRST_NODE + f'export PET_RDZV_ENDPOINT="$head:{port}" PET_RDZV_ID="$SLURM_JOB_ID"\n'
              + _SRUN + '"$@"')
    return ["bash", "-c", script, "alignflow-launch", *argv]


def msrun(layout: Layout, script: Sequence[str], options: Mapping[str, Any] | None = None
          ) -> tuple[list[str], str]:
    """argv of `script` (run_mindformer.py and its flags) under msrun, and the log to parse (relative to {out})."""
    given = dict(options or {})
    owned: dict[str, Any] = {"worker_num": layout.world, "local_worker_num": layout.per_node}
    _check_options(given, owned, "npu.msrun")
    opts: dict[str, Any] = {**owned, "master_port": 8118, "join": "True"}
    opts |= {k: v for k, v in given.items() if k not in owned}
    opts["log_dir"] = f"{{out}}/{MSRUN_LOGS}"
    argv = ["msrun", *[a for k, v in opts.items() for a in (f"--{k}", str(v))], *script]
    log = f"{MSRUN_LOGS}/worker_{layout.world - 1}.log"  # the last rank: the last pipeline stage
    if layout.nodes == 1:
        return argv, log
    inner = 'exec "$0" --master_addr="$ALIGNFLOW_MASTER_ADDR" --node_rank="$SLURM_NODEID" "$@"'
    outer = _FIRST_NODE + 'export ALIGNFLOW_MASTER_ADDR="$head"\n' + _SRUN + f"bash -c {shlex.quote(inner)} " + '"$@"'
    return ["bash", "-c", outer, "alignflow-launch", *argv], log


def parallel_flags(parallel: ParallelConfig) -> list[str]:
    """Megatron's parallel sizes (dp follows from the world size); none for the default 1s."""
    out: list[str] = []
    for flag, value in (("--tensor-model-parallel-size", parallel.tp), ("--pipeline-model-parallel-size", parallel.pp),
                        ("--expert-model-parallel-size", parallel.ep)):
        if value != 1:
            out += [flag, str(value)]
    return out


def mindformers_parallel(parallel: ParallelConfig) -> dict[str, Any]:
    """The MindFormers PyNative YAML keys of the layout (`parallelism.*`; the data-parallel size follows from
    the number of workers where the template leaves `data_parallel_shard: -1`)."""
    return {"parallelism.tensor_parallel": parallel.tp, "parallelism.pipeline_parallel": parallel.pp,
            "parallelism.expert_parallel": parallel.ep}


# torchrun's account of a failed worker (torch.distributed.elastic.multiprocessing.errors: `_MSG_FORMAT_TEMPLATE`,
# `_FAILURE_FORMAT_TEMPLATE`): the root cause is the first rank observed to fail.
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\n\[\d+\]:\s*\n(?P<body>(?:  .*\n?)+)")
_FIELD = re.compile(r"^  (?P<key>\w+)\s*: (?P<value>.*)$", re.MULTILINE)
_RANK = re.compile(r"(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_EXIT = re.compile(r"(?P<code>-?\d+) \(pid: \d+\)\s*(?:\((?P<signal>\w+)\))?")


def failed_rank(stderr: str) -> str | None:
    """Which rank of a torchrun job failed first and how (`rank 2 (local rank 2) on host h: exit code -9
    (SIGKILL)`), from torchrun's failure summary on stderr; None when it printed none."""
    found = list(_ROOT_CAUSE.finditer(stderr))
    if not found:
        return None
    fields = {m.group("key"): m.group("value").strip() for m in _FIELD.finditer(found[-1].group("body"))}
    rank = _RANK.match(fields.get("rank", ""))
    if rank is None:
        return None
    code = _EXIT.match(fields.get("exitcode", ""))
    how = (f"exit code {code.group('code')}" + (f" ({code.group('signal')})" if code.group("signal") else "")
           if code else f"exit code {fields.get('exitcode', '?')}")
    host = f" on host {fields['host']}" if fields.get("host") else ""
    return f"rank {rank.group('rank')} (local rank {rank.group('local')}){host} failed first: {how}"
