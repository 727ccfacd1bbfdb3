"""References to artifacts where they live: host, path, sha256 — passed between steps as plain data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from alignflow.errors import PipelineError
from alignflow.fingerprint import Fingerprint
from alignflow.pipeline import StepSpec
from alignflow.store.records import ArtifactRecord


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """An artifact on a host, with the fingerprint it had when it was recorded."""

    name: str
    host: str
    path: str
    sha256: str
    size: int
    kind: str
    manifest: list[list[Any]] | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArtifactRef:
        return cls(**{k: data[k] for k in ("name", "host", "path", "sha256", "size", "kind")},
                   manifest=data.get("manifest"))

    @classmethod
    def from_record(cls, record: ArtifactRecord) -> ArtifactRef:
        """The reference of an artifact row of the store."""
        manifest = record.manifest if isinstance(record.manifest, list) else None
        return cls(record.name, record.host, record.path, record.sha256, record.size_bytes, record.kind, manifest)

    def short(self) -> str:
        return f"{self.name}@{self.host}:{self.path} ({self.sha256[:12]})"

    @classmethod
    def from_fingerprint(cls, name: str, host: str, path: str, fp: Fingerprint, kind: str) -> ArtifactRef:
        """The reference of `path` on `host` as just fingerprinted there (a directory keeps its manifest)."""
        manifest = [[f.path, f.sha256, f.size] for f in fp.files] if fp.kind == "dir" else None
        return cls(name, host, path, fp.sha256, fp.size, kind, manifest)


def declared_inputs(spec: StepSpec, available: Mapping[str, ArtifactRef]) -> dict[str, ArtifactRef]:
    """The artifacts `spec` declares as inputs, from everything available so far (or why the step cannot run)."""
    missing = [n for n in spec.inputs if n not in available]
    if missing:
        raise PipelineError(f"step {spec.name} cannot run: no {', '.join(missing)} from an earlier step or the "
                            "parent run")
    return {n: available[n] for n in spec.inputs}
