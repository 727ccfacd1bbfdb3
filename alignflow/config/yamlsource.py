"""Read YAML with line numbers, and turn pydantic errors into `file:line: key: message` problems.

This is the only place alignflow parses YAML for configuration. PyYAML's composer gives every node a
start mark; we keep a map from each key path (`("hosts", "npu-a", "port")`) to its line so that a
validation error on `hosts.npu-a.port` is reported at the line where that key is written. Duplicate keys,
which `yaml.safe_load` silently collapses, are an error here (two hosts with the same name must not
quietly become one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from alignflow.errors import ConfigError

KeyPath = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML file: plain data plus the 1-based line of every key path."""

    path: Path
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, loc: KeyPath) -> int | None:
        """The line of `loc`, or of its nearest ancestor that has one."""
        for end in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return None


def load_yaml(path: str | Path) -> YamlDocument:
    """Parse `path`; raise `ConfigError` naming the file and line for a missing file or malformed YAML."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([(str(path), None, "file not found")]) from None
    except OSError as exc:
        raise ConfigError([(str(path), None, f"cannot read: {exc.strerror or exc}")]) from None
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str | Path = "<string>") -> YamlDocument:
    """Parse YAML text (see `load_yaml`)."""
    path = Path(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = exc.problem or exc.context or "malformed YAML"
        raise ConfigError([(str(path), line, f"malformed YAML: {what}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([(str(path), None, f"malformed YAML: {exc}")]) from None
    if node is None:
        return YamlDocument(path=path, data=None, lines={})
    lines: dict[KeyPath, int] = {}
    problems: list[tuple[str, int | None, str]] = []
    data = _convert(node, (), lines, problems, str(path), yaml.SafeLoader(""))
    if problems:
        raise ConfigError(problems)
    return YamlDocument(path=path, data=data, lines=lines)


def _convert(
    node: Node, loc: KeyPath, lines: dict[KeyPath, int], problems: list[Any], path: str, loader: yaml.SafeLoader
) -> Any:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, loader)
            if not isinstance(key, str | int | float | bool) or key is None:
                problems.append((path, key_node.start_mark.line + 1, "mapping keys must be plain scalars"))
                continue
            key_loc: KeyPath = (*loc, key if isinstance(key, str | int) else str(key))
            if key in out:
                dotted = ".".join(str(p) for p in key_loc)
                first = lines.get(key_loc)
                problems.append(
                    (path, key_node.start_mark.line + 1, f"{dotted}: duplicate key (first defined at line {first})")
                )
                continue
            lines[key_loc] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, key_loc, lines, problems, path, loader)
            lines[key_loc] = key_node.start_mark.line + 1
        return out
    if isinstance(node, SequenceNode):
        return [_convert(item, (*loc, i), lines, problems, path, loader) for i, item in enumerate(node.value)]
    return _scalar(node, loader)


def _scalar(node: Node, loader: yaml.SafeLoader) -> Any:
    if isinstance(node, ScalarNode):
        return loader.construct_object(node, deep=True)  # type: ignore[no-untyped-call]
    return None


def validate(model: type[M], doc: YamlDocument, *, context: dict[str, Any] | None = None) -> M:
    """Validate `doc.data` with `model`; every pydantic error becomes a `file:line: key: message` problem."""
    try:
        return model.model_validate(doc.data if doc.data is not None else {}, context=context)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, doc)) from None


def problems_from_validation(exc: ValidationError, doc: YamlDocument) -> list[tuple[str, int | None, str]]:
    """Translate a pydantic `ValidationError` into located problems, one per error."""
    problems: list[tuple[str, int | None, str]] = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not _is_union_tag(p))
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        message = _humanize(err)
        problems.append((str(doc.path), doc.line_of(loc), f"{dotted}: {message}"))
    return problems


def _is_union_tag(part: Any) -> bool:
    # pydantic puts the union member / function name into loc, e.g. ('hosts', 'a', 'function-after[...]').
    return isinstance(part, str) and (("[" in part and part.endswith("]")) or part.startswith("function-"))


_MESSAGES: dict[str, Callable[[dict[str, Any]], str]] = {
    "extra_forbidden": lambda e: "unknown key (not allowed here)",
    "missing": lambda e: "required key is missing",
}


def _humanize(err: Any) -> str:
    make = _MESSAGES.get(err["type"])
    if make is not None:
        return make(err)
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return msg
