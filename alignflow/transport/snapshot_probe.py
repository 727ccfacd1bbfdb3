"""Host probe: run ON a host by its Python (source sent on stdin), prints one JSON object about the host.

Standard library only, and tolerant: every tool that is missing (a package, git, npu-smi, nvidia-smi) is
recorded as missing, never an error, because a CPU conversion host has no accelerator and an Ascend host has
no torch (issue 3, item 5). Argument: one JSON object
`{"packages": [...], "repos": {name: path}, "env_names": [...], "env_prefixes": [...]}`.
"""

from __future__ import annotations  # the host's Python may be older than the controller's

import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any, TypedDict

_TIMEOUT_S = 20
_MAX_TEXT = 4000


def _cmd(argv: list[str], cwd: str | None = None) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, cwd=cwd, errors="replace")
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {_TIMEOUT_S} s"
    except OSError as exc:
        return 126, "", f"{argv[0]}: {exc}"
    return p.returncode, p.stdout, p.stderr


def _packages(names: list[str]) -> dict[str, Any]:
    from importlib import metadata

    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _repo(path: str) -> dict[str, Any]:
    info: dict[str, Any] = {"path": path, "commit": None, "dirty": None, "branch": None, "error": None}
    if not os.path.isdir(path):
        info["error"] = "no such directory"
        return info
    if shutil.which("git") is None:
        info["error"] = "git not installed"
        return info
    git = ["git", "-c", "safe.directory=*", "-C", path]
    code, out, err = _cmd([*git, "rev-parse", "HEAD"])
    if code != 0:
        info["error"] = (err.strip() or out.strip())[-500:] or f"git exited {code}"
        return info
    info["commit"] = out.strip()
    code, out, _ = _cmd([*git, "status", "--porcelain", "--untracked-files=no"])
    info["dirty"] = bool(out.strip()) if code == 0 else None
    code, out, _ = _cmd([*git, "rev-parse", "--abbrev-ref", "HEAD"])
    info["branch"] = out.strip() if code == 0 else None
    return info


def _tool(argv: list[str]) -> dict[str, Any]:
    if shutil.which(argv[0]) is None:
        return {"present": False, "output": None, "error": None}
    code, out, err = _cmd(argv)
    text = (out if code == 0 else (err or out)).strip()
    return {
        "present": True,
        "output": text[:_MAX_TEXT] if code == 0 else None,
        "error": None if code == 0 else (text[-500:] or f"exited {code}"),
    }


def _load() -> list[float] | None:
    """1, 5 and 15-minute load averages: a step time measured on a host busier than its cores measures the sharing."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


class ProbeRequest(TypedDict, total=False):
    """What to look for: the argument, as JSON."""

    packages: list[str]
    repos: dict[str, str]
    env_names: list[str]
    env_prefixes: list[str]


def probe(request: ProbeRequest) -> dict[str, object]:
    uname = platform.uname()
    env_names = set(request.get("env_names", []))
    prefixes = tuple(request.get("env_prefixes", []))
    env = {k: v for k, v in sorted(os.environ.items()) if k in env_names or k.startswith(prefixes)}
    return {
        "hostname": uname.node,
        "os": f"{uname.system} {uname.release} {uname.machine}",
        "python": {
            "executable": sys.executable,
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "packages": _packages(list(request.get("packages", []))),
        "repos": {name: _repo(path) for name, path in dict(request.get("repos", {})).items()},
        "accelerators": {
            "npu-smi": _tool(["npu-smi", "info"]),
            "nvidia-smi": _tool(
                ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"]
            ),
        },
        "tools": {name: shutil.which(name) for name in ("rsync", "openssl", "git", "tar", "ssh")},
        "env": env,
        "declared_env_missing": sorted(env_names - set(os.environ)),
        "load": _load(),
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    json.dump(probe(json.loads(sys.argv[1])), sys.stdout)
