"""Read YAML with line numbers, and turn pydantic errors into `file:line: key: message` problems.

This is the only place alignflow parses YAML for configuration. PyYAML's composer gives every node a
start mark; we keep a map from each key path (`("hosts", "npu-a", "port")`) to its line so that a
validation error on `hosts.npu-a.port` is reported at the line where that key is written. Duplicate keys,
which `yaml.safe_load` silently collapses, are an error here (two hosts with the same name must not
quietly become one).

Hostile input fails closed with `file:line` (issue 16): a file that is not UTF-8 names the line of the first bad
byte; aliases are followed, but an alias that contains itself (`&n [*n]`) is refused, and so is a document whose
aliases expand past `MAX_NODES` nodes (a "billion laughs" bomb of 9 anchors of 9 aliases each would otherwise
build 9^9 nodes); nesting deeper than `MAX_DEPTH` is refused at the line where it goes too deep, before the parser
reads further (PyYAML's scanner does work quadratic in the depth, and how deep it got before a `RecursionError` depended
on the process's recursion limit: a 5,000-deep flow list took 0.8 s at Python's default limit, 6.4 s at the 10,000 that
importing MindSpore sets).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import typing
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError
from yaml.events import Event
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from alignflow.errors import ConfigError, did_you_mean, did_you_mean_file

KeyPath = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)

# Nodes a document may expand to, aliases included. Real configurations have a few hundred (a MindFormers
# template about 300); the cap only stops alias bombs, long before they cost memory or time.
MAX_NODES = 100_000
# Collections inside collections a document may nest. Real configurations nest under ten deep (a MindFormers
# template six); the cap keeps the parser's recursion far below Python's default limit of 1,000 frames.
MAX_DEPTH = 100


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
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError([(str(path), None, f"file not found{did_you_mean_file(path)}")]) from None
    except OSError as exc:
        raise ConfigError([(str(path), None, f"cannot read: {exc.strerror or exc}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError([(str(path), line, f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
                            "(save the file as UTF-8)")]) from None
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str | Path = "<string>") -> YamlDocument:
    """Parse YAML text (see `load_yaml`). A text parsed before (the packaged specs, read for every experiment) is
    answered from a small cache of parsed documents, each caller getting its own copy of the data."""
    path = Path(path)
    key = (str(path), text)
    with _PARSED_LOCK:
        hit = _PARSED.get(key)
        if hit is not None:
            _PARSED.move_to_end(key)
    if hit is not None:
        return YamlDocument(path=path, data=copy.deepcopy(hit.data), lines=dict(hit.lines))
    doc = _parse_yaml(text, path)
    with _PARSED_LOCK:
        _PARSED[key] = YamlDocument(path=path, data=copy.deepcopy(doc.data), lines=dict(doc.lines))
        while len(_PARSED) > _PARSED_MAX:
            _PARSED.popitem(last=False)
    return doc


# Parsed documents by (path, text): the PyYAML composer is pure Python, and one experiment's validation reads every
# packaged conversion spec (the known model families) — most of a unit test's or a cached run's parsing.
_PARSED: OrderedDict[tuple[str, str], YamlDocument] = OrderedDict()
_PARSED_LOCK = threading.Lock()
_PARSED_MAX = 128


def _parse_yaml(text: str, path: Path) -> YamlDocument:
    try:
        node = yaml.compose(text, Loader=_DepthLimitedLoader)
    except _TooDeep as exc:
        raise ConfigError([(str(path), exc.line, f"malformed YAML: nested too deeply (more than {MAX_DEPTH} "
                            "levels)")]) from None
    except RecursionError:
        raise ConfigError([(str(path), None, "malformed YAML: nested too deeply")]) from None
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
    try:
        data = _convert(node, (), lines, problems, str(path), yaml.SafeLoader(""), _Expansion())
    except RecursionError:
        raise ConfigError([(str(path), None, "malformed YAML: nested too deeply")]) from None
    if problems:
        raise ConfigError(problems)
    return YamlDocument(path=path, data=data, lines=lines)


class _TooDeep(Exception):
    def __init__(self, line: int | None) -> None:
        super().__init__(line)
        self.line = line


class _DepthLimitedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a collection nested more than `MAX_DEPTH` deep as soon as the composer
    reaches its start."""

    _depth = 0

    @contextlib.contextmanager
    def _one_level_deeper(self) -> Iterator[None]:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event: Event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _TooDeep(event.start_mark.line + 1 if event.start_mark is not None else None)
            yield
        finally:
            self._depth -= 1

    def compose_sequence_node(self, anchor: dict[Any, Node]) -> SequenceNode:
        with self._one_level_deeper():
            return super().compose_sequence_node(anchor)

    def compose_mapping_node(self, anchor: dict[Any, Node]) -> MappingNode:
        with self._one_level_deeper():
            return super().compose_mapping_node(anchor)


class _Expansion:
    """What `_convert` has expanded so far: a node count against `MAX_NODES`, and the collections it is inside."""

    def __init__(self) -> None:
        self.nodes = 0
        self.open: set[int] = set()


def _convert(
    node: Node, loc: KeyPath, lines: dict[KeyPath, int], problems: list[Any], path: str, loader: yaml.SafeLoader,
    seen: _Expansion,
) -> Any:
    line = node.start_mark.line + 1
    lines.setdefault(loc, line)
    seen.nodes += 1
    if seen.nodes > MAX_NODES:
        raise ConfigError([(path, line, f"YAML aliases expand this document past {MAX_NODES} nodes (an alias "
                            "bomb?); write the values out or use fewer aliases")])
    if isinstance(node, MappingNode | SequenceNode):
        if id(node) in seen.open:
            raise ConfigError([(path, line, "recursive YAML alias: the node anchored here contains an alias of "
                                "itself")])
        seen.open.add(id(node))
        try:
            return _collection(node, loc, lines, problems, path, loader, seen)
        finally:
            seen.open.discard(id(node))
    return _scalar(node, loader)


def _collection(
    node: MappingNode | SequenceNode, loc: KeyPath, lines: dict[KeyPath, int], problems: list[Any], path: str,
    loader: yaml.SafeLoader, seen: _Expansion,
) -> Any:
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
            out[key] = _convert(value_node, key_loc, lines, problems, path, loader, seen)
            lines[key_loc] = key_node.start_mark.line + 1
        return out
    return [_convert(item, (*loc, i), lines, problems, path, loader, seen) for i, item in enumerate(node.value)]


def _scalar(node: Node, loader: yaml.SafeLoader) -> Any:
    if isinstance(node, ScalarNode):
        return loader.construct_object(node, deep=True)
    return None


def validate(model: type[M], doc: YamlDocument, *, context: dict[str, Any] | None = None) -> M:
    """Validate `doc.data` with `model`; every pydantic error becomes a `file:line: key: message` problem."""
    try:
        return model.model_validate(doc.data if doc.data is not None else {}, context=context)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, doc, model=model)) from None


def problems_from_validation(exc: ValidationError, doc: YamlDocument,
                             model: type[BaseModel] | None = None) -> list[tuple[str, int | None, str]]:
    """Translate a pydantic `ValidationError` into located problems, one per error (an unknown key of `model`
    names the closest allowed one)."""
    return [problem_from_error(err, doc, model=model) for err in exc.errors(include_url=False)]


_AT_KEY = "at_key"


def at_key(at: KeyPath, message: str) -> PydanticCustomError:
    """An error for a model validator to raise about the key `at` below its model (`configs.X.groups`), so that the
    problem is named and located at that key's line, not at the model's."""
    return PydanticCustomError(_AT_KEY, "{message}", {"at": tuple(at), "message": message})


def problem_from_error(err: Any, doc: YamlDocument, *, model: type[BaseModel] | None = None,
                       prefix: KeyPath = ()) -> tuple[str, int | None, str]:
    """One pydantic error as a located problem. `prefix`: where the validated mapping sits in `doc` (a patch
    inside the file), so that its line is found and its key is named in full."""
    loc = tuple(p for p in err["loc"] if not _is_union_tag(p))
    if err["type"] == _AT_KEY:  # a model's own rule naming the key below it that is wrong (`at_key`)
        loc = (*loc, *err["ctx"]["at"])
    dotted = ".".join(str(p) for p in (*prefix, *loc)) or "(top level)"
    message = _humanize(err)
    if err["type"] == "extra_forbidden" and model is not None and loc:
        data = doc.data
        for part in prefix:  # the validated mapping: a side section's keys are its backend's (by its `kind`)
            data = _child(data, part)
        hint = did_you_mean(str(loc[-1]), _allowed_keys(model, loc[:-1], data))
        message = f"unknown key{hint}" if hint else message
    return str(doc.path), doc.line_of((*prefix, *loc)), f"{dotted}: {message}"


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...], data: Any = None) -> list[str]:
    """The field names of the model found at `loc` inside `model` (empty when the path leaves the models). A model
    whose fields depend on the section's own data (a side section: its backend's, by `kind`) names the model that
    validates `data` at that place through a `model_for(data)` classmethod."""
    node: Any = model
    for part in loc:
        node = _concrete(_model_in(node), data)
        if node is None:
            return []
        data = _child(data, part)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return []
            node = field.annotation
        else:  # dict[str, X] (part is a key) or list[X] (part is an index)
            args = typing.get_args(node)
            node = args[-1] if args else None
    found = _concrete(_model_in(node), data)
    if isinstance(found, type) and issubclass(found, BaseModel):
        return list(found.model_fields)
    return []


def _concrete(node: Any, data: Any) -> Any:
    model_for = getattr(node, "model_for", None) if isinstance(node, type) else None
    return model_for(data) if callable(model_for) else node


def _child(data: Any, part: Any) -> Any:
    if isinstance(data, dict):
        return data.get(part)
    if isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
        return data[part]
    return None


def _model_in(annotation: Any) -> Any:
    """A BaseModel class, a dict/list type, or None: Optional/Union unwrapped to the first of those."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (dict, list, tuple):
        return annotation
    for arg in typing.get_args(annotation) if origin is not None else ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


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
