"""Print a pip constraints file pinning each direct dependency of pyproject.toml to its declared lower bound.

    pip install -c <(python3 .ci/floors.py) -e '.[...]'

CI installs these floors in a second environment and runs the CLI's help and the unit tier on them
(`make test-floors`): a lower bound in pyproject.toml is one the code was seen to run with. Extras keep their own
pins (the test tools, the frameworks); only `[project] dependencies` are floored.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

def floors(pyproject: Path) -> list[str]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        spec = dep.split(";")[0]
        for part in spec.split(","):
            m = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", part)
            if m:
                name = re.match(r"\s*([A-Za-z0-9_.-]+)", spec)
                assert name is not None
                out.append(f"{name.group(1)}=={m.group(1)}")
                break
    return out


def check(pins: list[str]) -> list[str]:
    """The pins this interpreter does not import at exactly the floor (the environment must hold the floors)."""
    from importlib import metadata

    wrong = []
    for pin in pins:
        name, version = pin.split("==")
        have = metadata.version(name)
        if have.split("+")[0] not in (version, version + ".0", version + ".0.0"):
            wrong.append(f"{name}: {have}, not the floor {version}")
    return wrong


# Packages beneath the floors, held to their floors' era: what a direct dependency at its floor was released beside.
# matplotlib before 3.11 calls pyparsing's camelCase names, which pyparsing 3.3 deprecates (warnings at every
# mathtext and font pattern parse, errors under the tests' `filterwarnings = error`).
ERA = ["pyparsing<3.3"]


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    pins = floors(root / "pyproject.toml")
    if sys.argv[1:] == ["--check"]:
        problems = check(pins)
        print("\n".join(problems) or f"the {len(pins)} direct dependencies are at their floors")
        sys.exit(1 if problems else 0)
    print("\n".join(pins + ERA))
