"""The settings of a side alignflow cannot read: what its launch template passes and what it declares.

A `command` side's trainer is the user's own script; preflight cannot read its configuration the way it reads a
MindFormers YAML or Megatron's flags. It takes what the template demonstrably passes (`{seed}` is the experiment's
seed) and what the side declares in its `settings` (in preflight's own names), and leaves every other row
*undeclared*: such a row is reported as not checked — never as agreeing — so the report says how much of the pair
was compared.
"""

from __future__ import annotations

from alignflow.backends.template import DeclaredSettings
from alignflow.errors import ConfigError
from alignflow.preflight.npu import Binder
from alignflow.preflight.rules import RULES
from alignflow.preflight.values import UNDECLARED, Value


def declared_settings(rendered: DeclaredSettings, *, side_name: str, bind: Binder) -> dict[str, Value]:
    """Every rule's setting of one side: its passed or declared value, else `UNDECLARED`."""
    known = {r.setting for r in RULES}
    unknown = sorted(set(rendered.values) - known)
    if unknown:
        raise ConfigError(f"{side_name}.settings: unknown setting(s) {', '.join(unknown)}; preflight compares: "
                          f"{', '.join(sorted(known - {'side.kind'}))}")
    s = {name: Value(UNDECLARED, f"not declared ({side_name}.settings)") for name in known}
    for name, (value, source) in rendered.values.items():
        if name == "data.file" and isinstance(value, str):
            s[name] = Value(bind(value, ""), source)
        else:
            s[name] = Value(tuple(value) if isinstance(value, list) else value, source)
    return s
