"""References to artifacts where they live: host, path, sha256 — passed between steps as plain data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
    def from_record(cls, record: Any) -> ArtifactRef:
        """The reference of an artifact row of the store."""
        manifest = record.manifest if isinstance(record.manifest, list) else None
        return cls(record.name, record.host, record.path, record.sha256, record.size_bytes, record.kind, manifest)

    def short(self) -> str:
        return f"{self.name}@{self.host}:{self.path} ({self.sha256[:12]})"
