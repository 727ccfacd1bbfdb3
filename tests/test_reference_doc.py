"""docs/reference/configuration.md is generated from the pydantic models that read the files (issue 34).

Every key of `hosts.yaml`, an experiment and `nightly.yaml` - its dotted path, type, default and the model's own
description - comes from `alignflow.config`; the test regenerates the page and compares, so a key added, renamed or
re-described in the code and not in the page (or the reverse) fails here. After changing a model:

    .venv/bin/python -m tests.test_reference_doc      # rewrites docs/reference/configuration.md
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from alignflow.config.catalog import NightlySettings
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host
from alignflow.config.sides import SideConfig, side_config_model, side_kinds

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "configuration.md"

HEADER = """\
# Configuration files: every key

<!-- Generated from alignflow/config by tests/test_reference_doc.py; do not edit by hand:
     .venv/bin/python -m tests.test_reference_doc rewrites it, and the test fails when it is stale. -->

[Reference index](README.md) · [Guides](../guide/README.md)

Every key alignflow reads from its three kinds of YAML file, from the pydantic models that read them
(`alignflow/config/`): its dotted path, its type, its default (none: required) and what it means. An unknown key is
an error naming its `file:line` and the closest key (`alignflow validate`). How the files are used:
[running experiments](../guide/running-experiments.md#configuration), [hosts](../guide/hosts-and-transports.md),
[Slurm](../guide/slurm.md), [team server and nightly](../guide/prefect-and-team-server.md).
"""

SECTIONS = (
    ("hosts.yaml: one host", "hosts.<name>", Host,
     "`hosts.yaml` holds `hosts:`, a mapping of host name to these keys (the committed one: three local hosts)."),
    ("experiments/NAME.yaml", "", Experiment, "One experiment: what both sides train, on what, compared how."),
    ("nightly.yaml", "", NightlySettings, "What `alignflow serve --nightly` runs every night and where it reports."),
)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list[{', '.join(_type_name(a) for a in args if a is not Ellipsis)}]"
    if origin is dict:
        return f"dict[{', '.join(_type_name(a) for a in args)}]"
    if origin is typing.Annotated:
        return _type_name(args[0])
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
        if isinstance(value, BaseModel):
            return "(see its keys)"
        return f"`{value!r}`" if value not in ({}, []) else "empty"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{field.default!r}`"


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The model a key's value is (directly, or optionally), to list its keys under the key's path."""
    candidates = [annotation, *typing.get_args(annotation)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def rows(model: type[BaseModel], prefix: str, seen: tuple[type[BaseModel], ...] = ()) -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        if field.exclude or (name == "name" and prefix.startswith("hosts.")):
            continue  # filled in by the loader, never written
        key = field.alias or name
        path = f"{prefix}.{key}" if prefix else key
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        out.append(f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {description} |")
        child = _nested(field.annotation)
        if child is not None and child not in seen:
            out += rows(child, path, (*seen, model))
    return out


def side_sections() -> list[str]:
    """`npu:` and `gpu:` are each a backend's own model, chosen by `kind`: its keys beyond every side's, per kind."""
    common = set(SideConfig.model_fields)
    parts = ["## Side sections, by kind", "",
             "Each of `npu:` and `gpu:` names its backend with `kind` (above); the rest of the section is that",
             "backend's own keys, written here as `gpu.KEY` (the same under `npu:`).", ""]
    for kind in sorted(side_kinds()):
        model = side_config_model(kind)
        if not model.__module__.startswith("alignflow."):
            continue  # a backend a test registered in this process (tests/backends' third twin): not alignflow's
        own = [r for r in rows(model, "gpu") if r.split("`")[1].split(".")[1] not in common]
        parts += [f"### kind: {kind}", "", "| key | type | default | meaning |", "|---|---|---|---|", *own, ""]
    return parts


def render() -> str:
    parts = [HEADER]
    for title, prefix, model, intro in SECTIONS:
        parts += [f"## {title}", "", intro, "", "| key | type | default | meaning |", "|---|---|---|---|",
                  *rows(model, prefix), ""]
        if model is Experiment:
            parts += side_sections()
    return "\n".join(parts).rstrip("\n") + "\n"


def test_the_configuration_reference_is_the_models_own() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/reference/configuration.md is stale: run `.venv/bin/python -m tests.test_reference_doc`")


def test_every_key_of_the_committed_files_is_in_the_reference(repo_root: Path) -> None:
    """The page's paths cover what the shipped files use (a sanity check of the walk over nested models)."""
    page = render()
    for key in ("hosts.<name>.workdir", "hosts.<name>.slurm.partition", "model.moe.num_experts", "training.steps",
                "gpu.megatron_version", "conversion.spec", "gate.rel_tol"):
        assert f"`{key}`" in page, key


if __name__ == "__main__":
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {PAGE}\n")
