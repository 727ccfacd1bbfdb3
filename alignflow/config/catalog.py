"""The experiments a deployment offers: `experiments/*.yaml` by name, and the nightly regression settings.

The Prefect UI renders the alignment deployment's `experiment` parameter as a dropdown of these names, so the
catalog is read once when the deployments are built (`alignflow serve`, or a worker importing the pool entry
points), every file validated then: a team server that offers a broken experiment would only fail later, in
the middle of the night.

An experiment that is valid but names hosts the inventory does not have (the committed GLM/Qwen experiments on
a fresh clone, whose hosts are a team's real machines) is *not served*, with the reason, instead of stopping
`serve`; a broken file still stops it. `check_serving` is that whole check, shared by `alignflow serve` and
`alignflow validate --hosts` (issue 19).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alignflow.config.experiment import check_hosts, load_experiment
from alignflow.config.hosts import Inventory, load_hosts
from alignflow.config.yamlsource import load_yaml, validate
from alignflow.errors import ConfigError
from alignflow.regression import DriftPolicy

DEFAULT_CRON = "0 2 * * *"


@dataclass(frozen=True, slots=True)
class Unserved:
    """A valid experiment file the inventory cannot run, and why (each problem as `PATH:LINE: message`)."""

    name: str
    path: Path
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ExperimentCatalog:
    """Experiment files by name (the file's stem), absolute paths; `unserved`: the ones left out, with why."""

    directory: Path
    files: tuple[tuple[str, Path], ...]
    unserved: tuple[Unserved, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.files)

    def path(self, name: str) -> Path:
        for known, path in self.files:
            if known == name:
                return path
        raise ConfigError(f"unknown experiment '{name}'; {self.directory} has: {', '.join(self.names) or 'nothing'}")

    def unserved_reason(self, name: str) -> str | None:
        """Why experiment `name` is not served ('; '-joined problems), or None when it is (or is unknown)."""
        for u in self.unserved:
            if u.name == name:
                return "; ".join(u.reasons)
        return None

    @classmethod
    def discover(cls, directory: str | Path, inventory: Inventory | None = None) -> ExperimentCatalog:
        """Every `*.yaml` / `*.yml` in `directory`, each loaded and validated; all problems in one error.

        With an `inventory`, an experiment whose hosts it lacks (or has in another role) is listed in `unserved`
        rather than failing the catalog; a catalog left with nothing to serve is an error naming every reason."""
        root = Path(directory).expanduser().resolve()
        if not root.is_dir():
            raise ConfigError(f"{root}: experiments directory not found")
        files = sorted(p for p in root.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            raise ConfigError(f"{root}: no experiment files (*.yaml) to offer")
        problems: list[tuple[str, int | None, str]] = []
        seen: dict[str, Path] = {}
        unserved: list[Unserved] = []
        for path in files:
            if path.stem in seen:
                problems.append((str(path), None, f"experiment name '{path.stem}' is also {seen[path.stem].name}"))
                continue
            seen[path.stem] = path
            try:
                experiment = load_experiment(path)
                doc_lines = load_yaml(path).lines
            except ConfigError as exc:
                problems.extend(exc.problems)
                continue
            if inventory is None:
                continue
            try:
                check_hosts(experiment, inventory, doc_lines=doc_lines)
            except ConfigError as exc:
                unserved.append(Unserved(path.stem, path, _host_reasons(path, exc, inventory)))
        if problems:
            raise ConfigError(problems)
        left_out = {u.name for u in unserved}
        served = tuple((name, path) for name, path in seen.items() if name not in left_out)
        if not served:
            raise ConfigError([(str(root), None, f"no experiment can run on the hosts of "
                                f"{inventory.source if inventory is not None else 'the inventory'}: "
                                + "; ".join(r for u in unserved for r in u.reasons))])
        return cls(directory=root, files=served, unserved=tuple(unserved))


AlertFormat = Literal["slack", "teams", "json"]


def _host_reasons(path: Path, exc: ConfigError, inventory: Inventory) -> tuple[str, ...]:
    """`glm.yaml:21: hosts.ascend: unknown host 'npu-a'`, ..., then once what the inventory defines."""
    reasons = [f"{path.name}:{line}: {message.split('; ')[0]}" if line else f"{path.name}: {message.split('; ')[0]}"
               for _, line, message in exc.problems]
    return (*reasons, f"{Path(inventory.source or 'hosts.yaml').name} defines: {', '.join(sorted(inventory.hosts))}")


class NightlyAlert(BaseModel):
    """Who hears of a regression: a webhook that `alignflow serve` wires to the nightly's failures (a Prefect
    notification block and an automation, both visible and editable in the UI)."""

    model_config = ConfigDict(extra="forbid")

    webhook: str | None = Field(None, description="URL the alert is posted to (http or https).")
    webhook_env: str | None = Field(
        None, description="Name of an environment variable of `alignflow serve` holding the URL (keeps the secret "
                          "out of the file).")
    format: AlertFormat = Field(
        "json", description="slack: a Slack incoming webhook; teams: a Microsoft Teams (Workflows) webhook; "
                            "json: any URL, posted {\"subject\": ..., \"text\": ...}.")

    @field_validator("webhook")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return None if value is None else check_webhook_url(value)

    @model_validator(mode="after")
    def _one_source(self) -> NightlyAlert:
        if (self.webhook is None) == (self.webhook_env is None):
            raise ValueError("give exactly one of webhook (the URL) and webhook_env (a variable holding it)")
        return self

    def url(self, environ: dict[str, str] | None = None) -> str:
        """The webhook's URL (read from the environment for `webhook_env`)."""
        if self.webhook is not None:
            return self.webhook
        import os

        env = os.environ if environ is None else environ
        value = env.get(str(self.webhook_env))
        if not value:
            raise ConfigError(f"alert.webhook_env: ${self.webhook_env} is not set in the environment of "
                              "`alignflow serve`")
        try:
            return check_webhook_url(value)
        except ValueError as exc:
            raise ConfigError(f"alert.webhook_env: ${self.webhook_env}: {exc}") from None


def check_webhook_url(value: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value


class NightlyExport(BaseModel):
    """Where the nightly writes each of its runs after the regression check (`alignflow export` for every run)."""

    model_config = ConfigDict(extra="forbid")

    tensorboard: str | None = Field(
        None, description="TensorBoard log dir: each run as DIR/<run id>/ (a relative DIR is under the state dir).")
    mlflow: str | None = Field(
        None, description="MLflow tracking URI (e.g. http://mlflow:5000): one MLflow run per side of each run.")

    @property
    def wanted(self) -> bool:
        return bool(self.tensorboard or self.mlflow)

    def tensorboard_dir(self, state: Path) -> Path | None:
        if not self.tensorboard:
            return None
        path = Path(self.tensorboard).expanduser()
        return path if path.is_absolute() else state / path


class NightlySettings(BaseModel):
    """`nightly.yaml`: what the nightly regression deployment runs, when, and how much drift it tolerates."""

    model_config = ConfigDict(extra="forbid")

    experiments: list[str] = Field(
        default_factory=list, description="Experiment names (files under experiments/) to run; empty = all of them."
    )
    cron: str = Field(DEFAULT_CRON, description="When the nightly runs (cron syntax, minute hour day month weekday).")
    timezone: str = Field("UTC", description="IANA time zone the cron schedule is read in (e.g. Asia/Shanghai).")
    drift: DriftPolicy = Field(default_factory=DriftPolicy, description="How far a criterion's value may grow.")
    alert: NightlyAlert | None = Field(None, description="A webhook called when the nightly finds a regression.")
    export: NightlyExport | None = Field(None, description="Export every run of the nightly to TensorBoard and/or "
                                         "MLflow after its regression check.")

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
    """Every experiment the nightly names is served (a typo, or hosts the inventory lacks, must not silently
    shrink the nightly)."""
    problems = []
    for name in settings.experiments:
        reason = catalog.unserved_reason(name)
        if reason is not None:
            problems.append(f"{source}: experiments: '{name}' is not served: {reason}")
    unknown = [n for n in settings.experiments if n not in catalog.names and catalog.unserved_reason(n) is None]
    if unknown:
        problems.append(f"{source}: experiments: unknown {', '.join(repr(n) for n in unknown)}; "
                        f"{catalog.directory} has: {', '.join(catalog.names)}")
    if problems:
        raise ConfigError("\n".join(problems))


@dataclass(frozen=True, slots=True)
class ServingCheck:
    """What `alignflow serve` would offer: the inventory, the catalog (served and not) and the nightly settings."""

    inventory: Inventory
    catalog: ExperimentCatalog
    nightly: NightlySettings
    nightly_source: str


def check_serving(experiments_dir: str | Path, hosts: str | Path, nightly: str | Path | None = None, *,
                  nightly_experiments: list[str] | None = None) -> ServingCheck:
    """Everything `serve` checks before it registers anything, except the cron's syntax (Prefect's own parser
    checks it, in `flows.serve`): the inventory, every experiment file, the nightly file and the experiments it
    runs (`nightly_experiments` replaces the file's list, as `serve --nightly-experiment` does)."""
    inventory = load_hosts(Path(hosts).expanduser().resolve())
    catalog = ExperimentCatalog.discover(experiments_dir, inventory)
    settings = load_nightly_settings(nightly) if nightly is not None else NightlySettings()
    source = str(nightly) if nightly is not None else "nightly settings"
    if nightly_experiments:
        settings = settings.model_copy(update={"experiments": list(nightly_experiments)})
    check_nightly_experiments(settings, catalog, source="--nightly-experiment" if nightly_experiments else source)
    if settings.alert is not None:
        settings.alert.url()  # a webhook_env that is not set fails now, not when the first regression happens
    return ServingCheck(inventory, catalog, settings, source)
