"""Resolve every name an experiment file refers to, where the file is read: the conversion spec and the flavour it
must write, the MindFormers template, the data prefix, a criteria file.

A name that does not resolve is a configuration error of the experiment — `file:line`, exit 2, the closest name
that exists — found by `alignflow validate`, `alignflow preflight` and before a run is recorded, never by a step
hours later (issue 40: `conversion.spec: twin-mo` passed both checks, then failed `convert_megatron` as a "failed
alignment"). Hosts are resolved against an inventory (`experiment.check_hosts`); this module needs none.

Everything here is cheap (a directory listing, a small YAML read): it runs on every `alignflow run` before
anything heavy is imported, so a spec is not loaded whole (its rules need torch); its own `alignflow convert
specs` self-check does that. What is checked of a spec here is what an experiment names of it: that it exists
(a packaged name or a file beside the experiment) and declares the Megatron flavour each Megatron-kind side loads.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from alignflow.config.sides import experiment_checks
from alignflow.config.yamlsource import KeyPath, load_yaml
from alignflow.errors import ConfigError, did_you_mean
from alignflow.pipeline import SIDE_NAMES

Problem = tuple[str, int | None, str]
SPEC_SUFFIXES = (".yaml", ".yml")


def packaged_spec_dir() -> Path:
    """Where the packaged conversion specs live (`alignflow/convert/specs`), found without importing the converter
    (which imports torch)."""
    return Path(str(importlib.resources.files("alignflow.convert") / "specs"))


def packaged_spec_names() -> list[str]:
    return sorted(p.stem for p in packaged_spec_dir().glob("*.yaml"))


def megatron_flavour(transformer_impl: str) -> str:
    """The flavour of the converted checkpoint that `gpu.transformer_impl` needs (`--flavor` of the conversion)."""
    return "te" if transformer_impl == "transformer_engine" else "local"


def resolve_names(experiment: Any, lines: dict[KeyPath, int] | None = None) -> list[Problem]:
    """Every name of `experiment` (an `Experiment` read from `experiment.source`) that does not resolve, each as a
    `(file, line, message)` problem with the closest existing name."""
    src = experiment.source or "experiment"
    where = lines or {}
    problems: list[Problem] = []

    def problem(loc: KeyPath, message: str) -> None:
        line = next((where[loc[:end]] for end in range(len(loc), 0, -1) if loc[:end] in where), None)
        problems.append((src, line, message))

    _check_spec(experiment, problem)
    _check_family(experiment, problem)
    for check in experiment_checks():  # the backends': the pipeline derived from the two sides' formats
        for loc, message in check(experiment):
            problem(loc, message)
    for side in SIDE_NAMES:  # a side whose backend renders a template of the user's (MindFormers' YAML)
        written = getattr(experiment.side(side), "template", None)
        if isinstance(written, str):
            template = experiment.resolve_path(written)
            if not template.is_file():
                problem((side, "template"), f"{side}.template: {written!r} not found ({template})"
                        + closest_file(template, written))
    _check_data(experiment, problem)
    _check_controller_paths(experiment, problem)
    _check_diagnose_step(experiment, problem)
    return problems


def _check_spec(experiment: Any, problem: Any) -> None:
    if experiment.conversion is None:  # no conversion spec named (a pipeline that converts is refused when derived)
        return
    name = experiment.conversion.spec
    if name.endswith(SPEC_SUFFIXES):
        path = Path(experiment.spec_ref)
        if not path.is_file():
            problem(("conversion", "spec"), f"conversion.spec: spec file {name!r} not found ({path})"
                    + closest_file(path, name))
            return
    else:
        known = packaged_spec_names()
        if name not in known:
            problem(("conversion", "spec"), f"conversion.spec: unknown conversion spec {name!r}"
                    f"{did_you_mean(name, known)}; packaged specs: {', '.join(known)} (or the path of a spec .yaml "
                    "file, relative to the experiment)")
            return
        path = packaged_spec_dir() / f"{name}.yaml"
    try:
        flavours = _spec_flavours(path)
    except ConfigError as exc:  # the spec file itself is broken: its own file:line problems
        for p in exc.problems:
            problem(("conversion", "spec"), f"conversion.spec {name!r}: {ConfigError.format_problem(p)}")
        return
    for side in SIDE_NAMES:  # a Megatron-kind side (its transformer_impl) loads that flavour of the converted names
        impl = getattr(experiment.side(side), "transformer_impl", None)
        if flavours is not None and isinstance(impl, str) and megatron_flavour(impl) not in flavours:
            problem((side, "transformer_impl"),
                    f"{side}.transformer_impl: {impl} needs the {megatron_flavour(impl)!r} flavour of the "
                    f"converted checkpoint, and conversion.spec {name!r} writes only: {', '.join(flavours)}")


def _spec_flavours(path: Path, chain: tuple[Path, ...] = ()) -> list[str] | None:
    """The `flavors:` a spec file declares, following `extends: <packaged name>` (None when none says)."""
    doc = load_yaml(path)
    data = doc.data if isinstance(doc.data, dict) else {}
    flavours = data.get("flavors")
    if isinstance(flavours, list):
        return [str(f) for f in flavours]
    parent = data.get("extends")
    if not isinstance(parent, str):
        return None
    parent_path = packaged_spec_dir() / f"{parent}.yaml"
    if not parent_path.is_file():
        known = packaged_spec_names()
        raise ConfigError([(str(path), doc.line_of(("extends",)),
                            f"extends: unknown spec {parent!r}{did_you_mean(parent, known)}")])
    if parent_path in chain:
        raise ConfigError([(str(path), doc.line_of(("extends",)), f"extends: cycle through {parent!r}")])
    return _spec_flavours(parent_path, (*chain, path))


def spec_family(path: Path, chain: tuple[Path, ...] = ()) -> str | None:
    """The `model.family` a spec file declares, following `extends: <packaged name>` (None when none says)."""
    doc = load_yaml(path)
    data = doc.data if isinstance(doc.data, dict) else {}
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("family"), str):
        return str(model["family"])
    parent = data.get("extends")
    parent_path = packaged_spec_dir() / f"{parent}.yaml"
    if not isinstance(parent, str) or not parent_path.is_file() or parent_path in chain:
        return None
    return spec_family(parent_path, (*chain, path))


def known_families(spec_file: Path | None = None) -> list[str]:
    """The model families alignflow knows: those the packaged conversion specs declare (`model.family`), and that
    of the experiment's own spec file. A family is only as known as its spec: the spec maps its weights."""
    families = {f for p in packaged_spec_dir().glob("*.yaml") if (f := spec_family(p)) is not None}
    if spec_file is not None and spec_file.is_file():
        try:
            own = spec_family(spec_file)
        except ConfigError:  # a broken spec file is reported as such (`_check_spec`)
            own = None
        families |= {own} if own else set()
    return sorted(families)


def _check_family(experiment: Any, problem: Any) -> None:
    """`model.family` names a family a conversion spec declares (issue 45: `twin-mo` trained with the field
    ignored)."""
    family = experiment.model.family
    spec = experiment.conversion.spec if experiment.conversion is not None else None
    spec_file = Path(experiment.spec_ref) if spec is not None and spec.endswith(SPEC_SUFFIXES) else None
    named = spec_file if spec_file is not None else packaged_spec_dir() / f"{spec}.yaml" if spec else None
    if named is not None and named.is_file() and _family_or_none(named) == family:
        return  # the family of the spec the experiment converts with: known without reading every other spec
    known = known_families(spec_file)
    if family not in known:
        problem(("model", "family"), f"model.family: unknown model family {family!r}{did_you_mean(family, known)}; "
                f"the conversion specs declare: {', '.join(known)} (a new family comes with its spec: "
                "`conversion.spec: <file>.yaml` declaring `model: {family: ...}`)")


def _family_or_none(path: Path) -> str | None:
    try:
        return spec_family(path)
    except ConfigError:  # a broken spec file is reported as such (`_check_spec`)
        return None


def _check_controller_paths(experiment: Any, problem: Any) -> None:
    """The base checkpoint, and data that lives only on the controller, exist on this machine (the controller that
    reads them), unless the experiment says how to make them (`generate`). Data declared on the training hosts
    (`data.host_paths`) is left to `preflight --check-hosts` and the run (issue 45: a `base.path` that does not exist
    passed validate, and the run failed without a line)."""
    declared = [(("base", "path"), "base.path", experiment.base, "checkpoint")] if experiment.base is not None else []
    if not experiment.data.host_paths:
        declared.append((("data", "path"), "data.path", experiment.data, "data"))
    for loc, key, section, what in declared:
        if section.generate is not None:
            continue
        path = experiment.resolve_path(section.path)
        if not path.exists():
            # base.generate makes Hugging Face checkpoints only (runner.session.prepare_base)
            makes = loc[0] == "data" or experiment.base.format == "hf"
            problem(loc, f"{key}: {what} {section.path!r} does not exist on this machine ({path})"
                    + closest_file(path, section.path, suffixes=())
                    + (f"; give an existing path, or `{loc[0]}.generate` to make it" if makes else ""))


def training_step_problem(step: int, experiment: Any) -> str | None:
    """Why `step` is not a step of `experiment`'s alignment trainings (1 to `training.steps`), or None."""
    steps = experiment.training.steps
    if 1 <= step <= steps:
        return None
    return f"{step} is not a step of the trainings (training.steps: {steps}); choose a step from 1 to {steps}"


def _check_diagnose_step(experiment: Any, problem: Any) -> None:
    """The diagnosed step is one of the trainings' steps."""
    if experiment.diagnose.step is None:
        return
    why = training_step_problem(experiment.diagnose.step, experiment)
    if why is not None:
        problem(("diagnose", "step"), f"diagnose.step: {why}")


def _check_data(experiment: Any, problem: Any) -> None:
    """A data directory that exists on this machine holds `<prefix>.bin` and `<prefix>.idx`. One that does not exist
    here is left to the run: it is generated (`data.generate`), or it lives on the controller that runs it."""
    data = experiment.data
    if data.prefix is None:
        return
    directory = experiment.resolve_path(data.path)
    if not directory.is_dir():
        return
    missing = [f"{data.prefix}{ext}" for ext in (".bin", ".idx") if not (directory / f"{data.prefix}{ext}").is_file()]
    if missing:
        have = sorted({p.stem for p in directory.glob("*.bin")} & {p.stem for p in directory.glob("*.idx")})
        problem(("data", "prefix"), f"data.prefix: {directory} has no {' / '.join(missing)}"
                f"{did_you_mean(data.prefix, have)}; indexed datasets there: {', '.join(have) or 'none'}")


def closest_file(path: Path, written: str, suffixes: Iterable[str] = SPEC_SUFFIXES) -> str:
    """` (did you mean 'x.yaml'?)` among the files of that directory with the same kind of suffix (any entry
    when `suffixes` is empty)."""
    if not path.parent.is_dir():
        return f"; its directory {path.parent} does not exist"
    names = [p.name for p in path.parent.iterdir() if not suffixes or p.suffix in tuple(suffixes)]
    hint = did_you_mean(path.name, names)
    if hint and "/" in written:
        return hint.replace("'", "'" + written.rsplit("/", 1)[0] + "/", 1)
    return hint
