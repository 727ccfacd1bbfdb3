"""Fill `{python}`, `{out}`, `{in:<artifact>}` placeholders of command templates with host paths.

Only known placeholders are replaced (a YAML flow mapping `{a: 1}` in a config file stays as written); an
unknown `{in:...}` is an error rather than a literal path that would make the job fail hours later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from alignflow.errors import PipelineError

_PLACEHOLDER = re.compile(r"\{(python|out|in:[A-Za-z0-9_]+)\}")


def fill(text: str, values: Mapping[str, str]) -> str:
    """Replace every known placeholder in `text`; raise `PipelineError` for one without a value."""

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise PipelineError(f"placeholder {{{key}}} has no value here (known: {', '.join(sorted(values))})")
        return values[key]

    return _PLACEHOLDER.sub(sub, text)


def fill_all(items: Iterable[str], values: Mapping[str, str]) -> list[str]:
    return [fill(item, values) for item in items]
