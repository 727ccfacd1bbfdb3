"""The packaged conversion specs: find, load (with `extends`), self-check and list them.

Loading a spec is cheap and strict: the YAML is validated with file:line errors, and the spec is expanded for
its own default model in every flavour it declares, so a spec whose rules do not fit its own model (an op
that cannot take a shape, a key produced twice) never loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from alignflow.config.yamlsource import YamlDocument, load_yaml, validate
from alignflow.convert.plan import build_plan
from alignflow.convert.spec import Spec
from alignflow.errors import ConfigError

SPEC_DIR = Path(__file__).parent / "specs"
_SECTIONS = ("global_rules", "layer_rules", "mtp_rules")


@dataclass(frozen=True, slots=True)
class SpecInfo:
    """One line of `alignflow convert specs`."""

    name: str
    description: str
    flavors: tuple[str, ...]
    path: str
    target_tensors: tuple[tuple[str, int], ...]  # flavour -> Megatron tensor keys for the spec's default model

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "flavors": list(self.flavors),
                "path": self.path, "target_tensors": dict(self.target_tensors)}


def spec_names() -> list[str]:
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def load_spec(name: str | Path) -> Spec:
    """A packaged spec by name (`twin-moe`), or a spec file by path. Raises `ConfigError` (file:line problems,
    or an unknown name with the known ones)."""
    path = Path(name)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        if str(name) not in spec_names():
            raise ConfigError(f"unknown conversion spec {str(name)!r}; known: {', '.join(spec_names())} "
                              "(or give the path of a spec .yaml file)")
        path = SPEC_DIR / f"{name}.yaml"
    return _load(path.resolve())


@lru_cache(maxsize=64)
def _load(path: Path) -> Spec:
    data, owners = _merged(path, ())
    doc = load_yaml(path)
    spec = validate(Spec, YamlDocument(path=path, data=data, lines=doc.lines))
    where: dict[tuple[str, int], str] = {}
    for section in _SECTIONS:
        source = owners.get(section, doc)
        for i in range(len(getattr(spec, section))):
            line = source.line_of((section, i))
            where[(section, i)] = f"{source.path.name}:{line}" if line is not None else f"{spec.name}:{section}[{i}]"
    spec.set_locations(where)
    _self_check(spec, path)
    return spec


def _merged(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, YamlDocument]]:
    """The spec's data with `extends: <name>` resolved (mappings merge deeply, anything else replaces), and for
    each top-level key the file that wrote it (for the rules' file:line)."""
    if path in chain:
        raise ConfigError([(str(path), None, f"extends cycle: {' -> '.join(p.name for p in (*chain, path))}")])
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise ConfigError([(str(path), 1, "a spec file is a mapping")])
    data = dict(doc.data)
    parent = data.pop("extends", None)
    owners = dict.fromkeys(data, doc)
    if parent is None:
        return data, owners
    parent_path = SPEC_DIR / f"{parent}.yaml"
    if not parent_path.is_file():
        raise ConfigError([(str(path), doc.line_of(("extends",)), f"extends: unknown spec {parent!r}")])
    base, base_owners = _merged(parent_path.resolve(), (*chain, path))
    return _deep_merge(base, data), {**base_owners, **owners}


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _self_check(spec: Spec, path: Path) -> None:
    problems = []
    for flavor in spec.flavors:
        try:
            plan = build_plan(spec, flavor=flavor)
        except ValueError as exc:  # a flavour no Megatron layer spec builds for the spec's model
            problems.append((str(path), None, f"flavors: {flavor}: {exc}"))
            continue
        problems += [(str(path), None, f"{flavor}: {p}") for p in plan.problems]
    if problems:
        raise ConfigError(problems)


def list_specs() -> list[SpecInfo]:
    """Every packaged spec, with its number of Megatron tensor keys per flavour for its default model."""
    out = []
    for name in spec_names():
        spec = load_spec(name)
        counts = tuple((f, len(build_plan(spec, flavor=f).targets)) for f in spec.flavors)
        out.append(SpecInfo(spec.name, spec.description, tuple(spec.flavors), str(SPEC_DIR / f"{name}.yaml"), counts))
    return out
