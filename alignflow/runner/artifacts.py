"""References to artifacts where they live: host, path, sha256 — passed between steps as plain data (`ArtifactRef`,
recorded by the store with the step runs that read them), and the inputs a step declares."""

from __future__ import annotations

from collections.abc import Mapping

from alignflow.errors import PipelineError
from alignflow.pipeline import StepSpec
from alignflow.store.records import ArtifactRef as ArtifactRef  # the runner's name for it


def declared_inputs(spec: StepSpec, available: Mapping[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """The artifacts `spec` declares as inputs, from everything available so far (or why the step cannot run)."""
    missing = [n for n in spec.inputs if n not in available]
    if missing:
        raise PipelineError(f"step {spec.name} cannot run: no {', '.join(missing)} from an earlier step or the "
                            "parent run")
    return {n: available[n] for n in spec.inputs}
