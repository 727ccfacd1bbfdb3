"""The experiments a deployment offers: `experiments/*.yaml` by name, and the nightly regression settings.

The Prefect UI renders the alignment deployment's `experiment` parameter as a dropdown of these names, so the
catalog is read once when the deployments are built (`alignflow serve`, or a worker importing the pool entry
points), every file validated then: a team server that offers a broken experiment would only fail later, in
the middle of the night.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alignflow.config.experiment import load_experiment
from alignflow.config.hosts import Inventory
from alignflow.config.yamlsource import load_yaml, validate
from alignflow.errors import ConfigError
from alignflow.regression import DriftPolicy

DEFAULT_CRON = "0 2 * * *"


@dataclass(frozen=True, slots=True)
class ExperimentCatalog:
    """Experiment files by name (the file's stem), absolute paths."""

    directory: Path
    files: tuple[tuple[str, Path], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.files)

    def path(self, name: str) -> Path:
        for known, path in self.files:
            if known == name:
                return path
        raise ConfigError(f"unknown experiment '{name}'; {self.directory} has: {', '.join(self.names) or 'nothing'}")

    @classmethod
    def discover(cls, directory: str | Path, inventory: Inventory | None = None) -> ExperimentCatalog:
        """Every `*.yaml` / `*.yml` in `directory`, each loaded and validated (host names against `inventory`
        when given); all problems in one error."""
        root = Path(directory).expanduser().resolve()
        if not root.is_dir():
            raise ConfigError(f"{root}: experiments directory not found")
        files = sorted(p for p in root.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            raise ConfigError(f"{root}: no experiment files (*.yaml) to offer")
        problems: list[tuple[str, int | None, str]] = []
        seen: dict[str, Path] = {}
        for path in files:
            if path.stem in seen:
                problems.append((str(path), None, f"experiment name '{path.stem}' is also {seen[path.stem].name}"))
                continue
            seen[path.stem] = path
            try:
                load_experiment(path, inventory)
            except ConfigError as exc:
                problems.extend(exc.problems)
        if problems:
            raise ConfigError(problems)
        return cls(directory=root, files=tuple(seen.items()))


class NightlySettings(BaseModel):
    """`nightly.yaml`: what the nightly regression deployment runs, when, and how much drift it tolerates."""

    model_config = ConfigDict(extra="forbid")

    experiments: list[str] = Field(
        default_factory=list, description="Experiment names (files under experiments/) to run; empty = all of them."
    )
    cron: str = Field(DEFAULT_CRON, description="When the nightly runs (cron syntax, minute hour day month weekday).")
    timezone: str = Field("UTC", description="IANA time zone the cron schedule is read in (e.g. Asia/Shanghai).")
    drift: DriftPolicy = Field(default_factory=DriftPolicy, description="How far a criterion's value may grow.")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        return check_timezone(value)


def check_timezone(value: str) -> str:
    """An IANA zone name the schedule can be read in (a typo would silently mean UTC elsewhere)."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r}; use an IANA name such as UTC or Asia/Shanghai") from None
    return value


def load_nightly_settings(path: str | Path) -> NightlySettings:
    """Load `nightly.yaml` (problems as `PATH:LINE: key: message`)."""
    return validate(NightlySettings, load_yaml(path))


def check_nightly_experiments(settings: NightlySettings, catalog: ExperimentCatalog, *, source: str) -> None:
    """Every experiment the nightly names is in the catalog (a typo must not silently shrink the nightly)."""
    unknown = [n for n in settings.experiments if n not in catalog.names]
    if unknown:
        raise ConfigError(f"{source}: experiments: unknown {', '.join(repr(n) for n in unknown)}; "
                          f"{catalog.directory} has: {', '.join(catalog.names)}")
