"""Megatron-LM's argument parser as data: the flags `pretrain_gpt.py` accepts, per megatron-core version.

Megatron-LM stops at argparse on an unknown or misspelt flag (`--lr-warmup-iter`), a flag without its value, a
value of the wrong type or a choice it does not know — on the GPU host, hours into an experiment, after the
NPU's base training has run. The megatron-core wheel does not ship `megatron.training`, where those flags are
defined (many generated from `TransformerConfig` since 0.16), so alignflow carries the parser's shape as tables
generated from Megatron-LM checkouts (`megatron_flags/core_v0.16.json`, ...): every argument's option strings,
arity, type and choices — names and shapes only, no code. Preflight rebuilds an argparse parser from the table
of the experiment's `gpu.megatron_version` and parses the generated command line with it, so it refuses what
Megatron's own parser would refuse (no abbreviations, as Megatron's `allow_abbrev=False`).

    python -m alignflow.frameworks.megatron_lm table CHECKOUT [--out FILE]   # a table from a Megatron-LM checkout

`table` imports `megatron.training.arguments` from the checkout (it needs what that module imports: torch and,
from core 0.16 on, triton) and records the checkout's `git describe`.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from alignflow.frameworks.megatron_versions import MegatronVersionError, parse_version

TABLES = "megatron_flags"
_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str}


def describe_parser(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """Every optional argument of `parser` as JSON-able data (sorted by its first option string)."""
    rows = []
    for action in parser._actions:  # argparse keeps no public list of its actions
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        if action.nargs == 0:  # a switch: store_true / store_false / store_const / --x/--no-x
            typ = None
        elif action.type is None or action.type in (int, float, str):
            typ = (action.type or str).__name__
        else:  # a converter function (e.g. the attention backend's enum): its input cannot be checked here
            typ = "other"
        rows.append({
            "flags": sorted(action.option_strings),
            "dest": action.dest,
            "nargs": action.nargs,
            "type": typ,
            "choices": None if action.choices is None or typ == "other" else sorted(str(c) for c in action.choices),
            "default": _jsonable(action.default),
            "sets": _sets(action),
        })
    return sorted(rows, key=lambda r: r["flags"][0])


def _jsonable(value: Any) -> Any:
    """`value` if JSON holds it as is, else `{"repr": ...}` (an enum default, say): readable, never evaluated."""
    try:
        json.dumps(value)
    except TypeError:
        return {"repr": repr(value)}
    return value


def _sets(action: argparse.Action) -> dict[str, Any] | None:
    """What each option string of a switch stores (`--no-rope-fusion` -> False); None for an argument with values."""
    if action.nargs != 0:
        return None
    if isinstance(action, argparse.BooleanOptionalAction):
        return {flag: not flag.startswith("--no-") for flag in action.option_strings}
    return {flag: _jsonable(action.const) for flag in action.option_strings}


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise _Refused(message)


def parser_from_table(table: dict[str, Any], *, values: bool = True) -> argparse.ArgumentParser:
    """An argparse parser that accepts and refuses what the tabled Megatron-LM parser does.

    `values=False` checks names and arity only (to list every unknown flag before the first bad value).
    """
    parser = _Parser(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False)
    for row in table["arguments"]:
        kwargs: dict[str, Any] = {"dest": row["dest"]}
        if row["nargs"] == 0:
            kwargs["action"] = "store_const"
            kwargs["const"] = True
        else:
            if row["nargs"] is not None:
                kwargs["nargs"] = row["nargs"]
            convert = _TYPES.get(row["type"], str) if values else str  # "other": any text (converter not tabled)
            kwargs["type"] = convert
            if values and row["choices"] is not None:  # kept as text: compared after argparse's conversion
                kwargs["choices"] = [convert(c) for c in row["choices"]]
        parser.add_argument(*row["flags"], **kwargs)
    return parser


def available() -> list[str]:
    """The megatron-core versions (`0.16`, ...) that have a flag table."""
    root = resources.files("alignflow.frameworks") / TABLES
    names = [p.name for p in root.iterdir() if p.name.startswith("core_v") and p.name.endswith(".json")]
    return sorted((n[len("core_v"):-len(".json")] for n in names), key=lambda v: tuple(int(x) for x in v.split(".")))


@cache
def load_table(version: str) -> dict[str, Any] | None:
    """The flag table of megatron-core `version` (`0.16`, `0.16.1` -> its minor release), or None.

    A version that is not one (`latest`) raises MegatronVersionError (a ConfigError), as the converter does."""
    major, minor_ = parse_version(version)
    minor = f"{major}.{minor_}"
    path = resources.files("alignflow.frameworks") / TABLES / f"core_v{minor}.json"
    if not path.is_file():
        return None
    table: dict[str, Any] = json.loads(path.read_text())
    return table


def check_flags(argv: Sequence[str], version: str) -> tuple[bool | None, str]:
    """Does Megatron-LM `version`'s parser accept `argv` (the flags after `pretrain_gpt.py`)?

    (True, source) accepted; (False, reasons) refused, with a close spelling for each unknown flag, or `version`
    is not a megatron-core version; (None, why) when there is no table for `version`.
    """
    try:
        table = load_table(version)
    except MegatronVersionError as exc:  # the converter refuses it too: the run cannot start
        return False, str(exc)
    if table is None:
        return None, (f"no flag table for megatron-core {version} (alignflow has {', '.join(available())}; "
                      "make one with `python -m alignflow.frameworks.megatron_lm table CHECKOUT`)")
    known = sorted({f for row in table["arguments"] for f in row["flags"]})
    where = f"the parser of {table['source']}"
    reasons = []
    try:
        _, unknown = parser_from_table(table, values=False).parse_known_args(list(argv))
    except _Refused as exc:  # a flag without its value
        return False, f"{where}: {exc}"
    after_unknown_flag = False
    for arg in unknown:
        if arg.startswith("-"):
            flag = arg.split("=", 1)[0]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.8)
            reasons.append(f"unknown flag {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
            after_unknown_flag = True
        elif not after_unknown_flag:  # an unknown flag's values follow it in `unknown`
            reasons.append(f"stray value {arg!r} (after a flag that takes none?)")
    try:
        parser_from_table(table).parse_known_args(list(argv))
    except _Refused as exc:  # a value of the wrong type, or not one of the choices
        reasons.append(str(exc))
    return (False, f"{where}: " + "; ".join(reasons)) if reasons else (True, where)


def table_from_checkout(checkout: Path) -> dict[str, Any]:
    """Build the table of the Megatron-LM checkout at `checkout` (imports its `megatron.training.arguments`)."""
    import typing

    if not hasattr(typing, "override"):  # Megatron-LM 0.18+ imports typing.override (Python 3.12); a no-op here
        typing.override = lambda f: f  # type: ignore[attr-defined]
    sys.path.insert(0, str(checkout))
    from megatron.core import package_info
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    described = subprocess.run(["git", "-C", str(checkout), "describe", "--tags", "--always", "--dirty"],
                               capture_output=True, text=True, check=False).stdout.strip()
    return {"source": f"Megatron-LM {described or 'checkout'} (megatron-core {package_info.__version__})",
            "megatron_core": package_info.__version__, "allow_abbrev": False,
            "arguments": describe_parser(parser)}


def dump_table(table: dict[str, Any]) -> str:
    """The table as JSON with one argument per line (reviewable diffs between versions)."""
    head = {k: v for k, v in table.items() if k != "arguments"}
    rows = ",\n".join("  " + json.dumps(row) for row in table["arguments"])
    return json.dumps(head, indent=1)[:-2] + ',\n "arguments": [\n' + rows + "\n ]\n}\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m alignflow.frameworks.megatron_lm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="write the flag table of a Megatron-LM checkout")
    t.add_argument("checkout", type=Path)
    t.add_argument("--out", type=Path, help="file to write (default: stdout)")
    args = ap.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore")
    text = dump_table(table_from_checkout(args.checkout.resolve()))
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
