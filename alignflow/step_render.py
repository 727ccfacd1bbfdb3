"""What one step of an experiment would run, as the run would render it: argv, environment, config files.

Built only on the runner's public pieces — `alignflow.backends.commands.step_command` (the template the runner
launches), `alignflow.runner.placeholders.fill` (how `{python}`, `{out}` and `{in:NAME}` become host paths),
`alignflow.config.placement.place` (which host a step runs on) — and the transport's `render_prologue` (how a
host's env and setup lines and the step's env reach the command), so that nothing here is a second opinion.

Placeholders are filled where their value is known before a run: `{python}` from the host, `{in:data}` from
`data.host_paths` or from where the runner stages it (`<workdir>/inputs/data-<sha256[:16]>`, when the data's
sha256 is known). The rest (`{out}`, a checkpoint produced by an earlier step) stay as placeholders unless given
(`values`), because the run names them only once it has the inputs' fingerprints.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host, Inventory
from alignflow.errors import ConfigError

DATA_SHA_UNKNOWN = "<data sha256: computed when the run starts>"
_KNOWN = re.compile(r"\{(python|out|in:[A-Za-z0-9_]+)\}")


@dataclass(frozen=True, slots=True)
class RenderedStep:
    """One step's command as it would run."""

    step: str
    host: Host | None
    argv: tuple[str, ...]
    env: dict[str, str]  # the step's own environment (the host's `env` is in `host_env`)
    host_env: dict[str, str]
    setup: tuple[str, ...]
    files: dict[str, str]  # path relative to {out} -> text
    out: str
    unfilled: tuple[str, ...] = field(default=())  # placeholders left as written

    def text(self) -> str:
        """Human-readable: where, environment, files, command."""
        where = f"host {self.host.name} (role {self.host.role}, {self.host.transport})" if self.host else \
            "no hosts file given: host paths left as placeholders"
        lines = [f"# step {self.step} on {where}"]
        if self.unfilled:
            lines.append(f"# not known before the run: {', '.join(self.unfilled)}")
        if self.host_env or self.setup:
            lines.append("# host environment and setup lines (hosts.yaml)")
            lines += [f"export {k}={shlex.quote(v)}" for k, v in self.host_env.items()]
            lines += list(self.setup)
        lines.append("# step environment")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.env.items()] or ["# (none)"]
        for rel, text in self.files.items():
            lines.append(f"# file {self.out}/{rel}")
            lines += text.rstrip("\n").splitlines()
        lines.append(f"# command (run in {self.out}; its stdout is the step's log)")
        lines.append(shlex.join(self.argv))
        return "\n".join(lines) + "\n"

    def script(self) -> str:
        """A bash script that runs the step as the transport would: host env, setup lines, step env, cwd {out},
        its config files written first; the command's stdout is the training log."""
        from alignflow.transport.commands import render_prologue

        lines = ["#!/usr/bin/env bash", f"# alignflow render: step {self.step}", "set -u",
                 f"mkdir -p -- {shlex.quote(self.out)} || exit 125"]
        for i, (rel, text) in enumerate(self.files.items()):
            mark = f"ALIGNFLOW_FILE_{i}"
            path = f"{self.out}/{rel}"
            lines += [f"mkdir -p -- {shlex.quote(str(Path(path).parent))}",
                      f"cat > {shlex.quote(path)} <<'{mark}'", text.rstrip("\n"), mark]
        lines.append(render_prologue(host_env=self.host_env, setup=self.setup, env=self.env, cwd=self.out))
        lines.append(shlex.join(self.argv))
        return "\n".join(lines) + "\n"


def render_step(experiment: Experiment, step: str, *, inventory: Inventory | None = None,
                values: Mapping[str, str] | None = None, data_sha256: str | None = None) -> RenderedStep:
    """The command `step` of `experiment` would run (on its host, when `inventory` is given)."""
    from alignflow.backends.commands import step_command
    from alignflow.backends.registry import pipeline_for
    from alignflow.runner.placeholders import fill

    pipeline_for(experiment).step(step)  # an unknown name, or one this experiment has not, is refused with its steps
    sha = data_sha256 or experiment.data.sha256 or _data_sha256(experiment)
    command = step_command(experiment, step, data_sha256=sha or DATA_SHA_UNKNOWN)
    template = command.template
    known: dict[str, str] = {}
    host: Host | None = None
    if inventory is not None:
        from alignflow.config.placement import place
        from alignflow.transport import open_transport

        host = place(experiment, inventory, steps=(step,)).host(step)  # a step with a command: never the controller
        known["python"] = open_transport(host).python()
        on_host = experiment.data.host_paths.get(host.role)
        if on_host is not None:
            known["in:data"] = on_host
        elif sha:
            known["in:data"] = f"{host.workdir.rstrip('/')}/inputs/data-{sha[:16]}"
    for key, value in (values or {}).items():
        if not _KNOWN.fullmatch("{" + key + "}"):
            raise ConfigError(f"render: --set {key}=...: placeholders are python, out and in:NAME")
        known[key] = value
    used = sorted({m.group(1) for text in (*template.argv, *template.env.values(), *template.files.values())
                   for m in _KNOWN.finditer(text)})
    unfilled = tuple(f"{{{k}}}" for k in used if k not in known)
    fill_values = {**{k: f"{{{k}}}" for k in used}, **known}  # unknown ones stay as written
    return RenderedStep(
        step=step, host=host, argv=tuple(fill(a, fill_values) for a in template.argv),
        env={k: fill(v, fill_values) for k, v in template.env.items()},
        host_env=dict(host.env) if host else {}, setup=tuple(host.setup) if host else (),
        files={rel: fill(text, fill_values) for rel, text in template.files.items()},
        out=fill_values.get("out", "{out}"), unfilled=unfilled)


def _data_sha256(experiment: Experiment) -> str | None:
    """The data's fingerprint when its directory exists on this machine (checked as the run checks it)."""
    from alignflow.fingerprint import fingerprint
    from alignflow.twin.data import check_data_dir

    path = experiment.resolve_path(experiment.data.path)
    if not path.is_dir():
        return None
    check_data_dir(path, experiment.data.prefix or "", where=f"{experiment.source}: data")
    return fingerprint(path).sha256


@dataclass(frozen=True, slots=True)
class PipelineView:
    """An experiment's steps as derived from its checkpoint formats: what `alignflow render EXPERIMENT` prints."""

    experiment: str
    sides: dict[str, dict[str, object]]  # side -> backend, host role, what it loads
    base: str
    steps: tuple[dict[str, object], ...]

    def text(self) -> str:
        lines = [f"# pipeline of {self.experiment}: base {self.base}"]
        for name, side in self.sides.items():
            lines.append(f"#   {name} side: {side['kind']} on host role {side['role']}, loads {side['loads']} "
                         f"({side['format']})")
        width = max(len(str(s["name"])) for s in self.steps)
        for s in self.steps:
            ins = ", ".join(map(str, s["inputs"])) or "-"  # type: ignore[call-overload]
            outs = ", ".join(map(str, s["outputs"]))  # type: ignore[call-overload]
            optional = " (optional)" if s["optional"] else ""
            lines.append(f"{str(s['name']).ljust(width)}  {str(s['role']).ljust(10)}  {ins} -> {outs}{optional}"
                         f"  # {s['description']}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, object]:
        return {"experiment": self.experiment, "base": self.base, "sides": self.sides, "steps": list(self.steps)}


def pipeline_view(experiment: Experiment) -> PipelineView:
    """The experiment's derived pipeline, for people (`alignflow render EXPERIMENT`) and the UI."""
    from alignflow.backends.registry import pipeline_for
    from alignflow.pipeline import SIDES

    pipe = pipeline_for(experiment)
    assert pipe.formats is not None
    base = (f"{experiment.base.format} checkpoint {experiment.base.path}" if experiment.base is not None else
            f"{pipe.formats.base} checkpoint trained by npu_base_train")
    sides: dict[str, dict[str, object]] = {
        s.name: {"kind": experiment.side(s.name).kind, "role": s.role, "loads": pipe.load(s.name),
                 "format": pipe.load_format(s.name)} for s in SIDES}
    steps: tuple[dict[str, object], ...] = tuple({
        "name": s.name, "role": s.role, "inputs": list(s.inputs), "outputs": list(s.output_names),
        "optional": s.optional, "description": s.description, "converts": list(s.converts) if s.converts else None,
        "side": s.side} for s in pipe.steps)
    return PipelineView(experiment.name, sides, base, steps)
