"""How host paths are quoted in what a backend renders: the placeholder grammar and YAML that can take any path.

A backend renders config files before the host is known, with `{python}`, `{out}`, `{in:<artifact>}` in place
of paths; `alignflow.runner.placeholders.fill` puts the paths in. In YAML that `yaml_text` rendered (it starts
with `YAML_HEADER`), every string holding a placeholder is a one-line double-quoted scalar, so `fill` can escape
each value with `yaml_double_quoted` and any path - quotes, `: `, `#`, newlines - parses back to itself (issue
16: a workdir holding `'` made the NPU side's config malformed).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

PLACEHOLDER = re.compile(r"\{(python|out|in:[A-Za-z0-9_]+)\}")
YAML_HEADER = "# rendered by alignflow: host paths are filled in escaped for YAML double-quoted strings\n"

# What a YAML double-quoted scalar may hold literally (PyYAML's printable set, less the characters that are
# line breaks in YAML 1.1, which a double-quoted scalar would fold into spaces); everything else is escaped.
_YAML_LITERAL = re.compile(r"[\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")


def yaml_double_quoted(value: str) -> str:
    """`value` escaped for the inside of a YAML double-quoted scalar: `"` + this + `"` parses back to `value`."""
    out = []
    for c in value:
        if c in '"\\':
            out.append("\\" + c)
        elif _YAML_LITERAL.fullmatch(c):
            out.append(c)
        elif ord(c) <= 0xFF:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return "".join(out)


class _TemplateDumper(yaml.SafeDumper):
    """SafeDumper whose strings holding a placeholder are double-quoted scalars (so `fill` can escape into them)."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if PLACEHOLDER.search(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_TemplateDumper.add_representer(str, _represent_str)


def yaml_text(data: Any) -> str:
    """YAML of a config template, headed by `YAML_HEADER`, whose placeholders `fill` escapes for YAML."""
    # width: never fold a long scalar onto two lines (a placeholder is always on one line, inside its quotes)
    return YAML_HEADER + yaml.dump(data, Dumper=_TemplateDumper, sort_keys=False, allow_unicode=True,
                                   width=1 << 30)
