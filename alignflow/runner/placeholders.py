"""Fill `{python}`, `{out}`, `{in:<artifact>}` placeholders of command templates with host paths, quoted for
the format each one goes into.

Only known placeholders are replaced (a YAML flow mapping `{a: 1}` in a config file stays as written); an
unknown `{in:...}` is an error rather than a literal path that would make the job fail hours later.

A host path may hold any character but NUL: a workdir `/data/it's here` once turned the rendered
`config.yaml` into malformed YAML (issue 16). So a value is never spliced in raw where raw is not literal:
- argv items and env values are literal already (argv travels as argv; env values are shell-quoted when they
  are exported), so a placeholder there is the value itself;
- a YAML config a backend renders with `backends.quoting.yaml_text` starts with `YAML_HEADER`, and every string
  in it that holds a placeholder is a one-line double-quoted scalar: in such a text each value is escaped for a
  double-quoted scalar, so any path parses back to itself (and the template still reads `{in:data}` to a YAML
  reader, such as preflight);
- in the script of a command template `[bash, -c, SCRIPT]` (or sh, dash, zsh, ksh), each value becomes one
  shell word (`shlex.quote`): write placeholders bare there, not inside quotes.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Mapping

from alignflow.backends.quoting import PLACEHOLDER, YAML_HEADER, yaml_double_quoted
from alignflow.errors import PipelineError

_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})

_QUOTE: dict[str, Callable[[str], str]] = {"yaml": yaml_double_quoted, "sh": shlex.quote}


def fill(text: str, values: Mapping[str, str], *, quote: str | None = None) -> str:
    """Replace every known placeholder in `text`; raise `PipelineError` for one without a value.

    Values are quoted for `quote` ("yaml" or "sh"); by default for YAML in a text that `yaml_text` rendered,
    else not at all (see the module docstring).
    """
    fmt = quote or ("yaml" if text.startswith(YAML_HEADER) else None)
    escape = _QUOTE[fmt] if fmt else None

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise PipelineError(f"placeholder {{{key}}} has no value here (known: {', '.join(sorted(values))})")
        return escape(values[key]) if escape else values[key]

    return PLACEHOLDER.sub(sub, text)


def fill_all(items: Iterable[str], values: Mapping[str, str]) -> list[str]:
    """Fill an argv; the script of `bash -c SCRIPT` (or sh, dash, zsh, ksh) gets its values shell-quoted."""
    out: list[str] = []
    for item in items:
        script = len(out) >= 2 and out[-1] == "-c" and posixpath.basename(out[-2]) in _SHELLS
        out.append(fill(item, values, quote="sh" if script else None))
    return out
