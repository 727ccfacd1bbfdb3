"""Configuration: pydantic models of `hosts.yaml` and `experiments/*.yaml`, and their loaders.

Every loader reports problems as `PATH:LINE: key: message` (`ConfigError.problems`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from alignflow.config.criteria import load_criteria
from alignflow.config.experiment import Experiment, check_hosts, load_experiment
from alignflow.config.hosts import Host, Inventory, load_hosts
from alignflow.config.model import ModelConfig, TrainingConfig
from alignflow.config.yamlsource import YamlDocument, load_yaml, validate
from alignflow.errors import ConfigError

FileKind = Literal["hosts", "experiment", "criteria", "nightly"]

__all__ = [
    "ConfigError",
    "Experiment",
    "FileKind",
    "Host",
    "Inventory",
    "ModelConfig",
    "TrainingConfig",
    "YamlDocument",
    "check_hosts",
    "detect_kind",
    "load_criteria",
    "load_experiment",
    "load_hosts",
    "load_yaml",
    "validate",
    "validate_file",
]


def detect_kind(doc: YamlDocument) -> FileKind:
    """Tell a hosts file from an experiment or a criteria file by its top-level keys."""
    data = doc.data
    if not isinstance(data, dict):
        raise ConfigError([(str(doc.path), 1, "expected a mapping at the top level")])
    if "hosts" in data and "model" not in data and "name" not in data:
        return "hosts"
    if "criteria" in data and set(data) <= {"criteria", "description"}:
        return "criteria"
    if "model" in data or "name" in data:
        return "experiment"
    from alignflow.config.catalog import NightlySettings

    if data and set(data) <= set(NightlySettings.model_fields):
        return "nightly"
    raise ConfigError([(str(doc.path), 1, "cannot tell what this file is: expected `hosts:` (an inventory), "
                        "`name:` + `model:` (an experiment), `criteria:` (acceptance criteria) or `experiments:` / "
                        "`cron:` (nightly settings)")])


def validate_file(path: str | Path, inventory: Inventory | None = None) -> FileKind:
    """Validate one configuration file of any kind; raise `ConfigError` with every problem found."""
    doc = load_yaml(path)
    kind = detect_kind(doc)
    if kind == "hosts":
        load_hosts(path)
    elif kind == "experiment":
        load_experiment(path, inventory)
    elif kind == "nightly":
        from alignflow.config.catalog import load_nightly_settings

        load_nightly_settings(path)
    else:
        load_criteria(path)
    return kind


