"""`nightly.yaml`'s `alert` (issue 19): one webhook, its format, refused with file:line when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config.catalog import load_nightly_settings
from alignflow.errors import ConfigError


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "nightly.yaml"
    path.write_text(text)
    return load_nightly_settings(path)


def test_a_webhook_and_its_format(tmp_path: Path) -> None:
    settings = load(tmp_path, "experiments: [demo]\nalert: {webhook: 'https://hooks.slack.com/services/T/B/X', "
                              "format: slack}\n")
    alert = settings.alert  # type: ignore[attr-defined]
    assert (alert.format, alert.url()) == ("slack", "https://hooks.slack.com/services/T/B/X")
    from_env = load(tmp_path, "alert: {webhook_env: TEAM_HOOK}\n").alert  # type: ignore[attr-defined]
    assert from_env.format == "json"
    assert from_env.url({"TEAM_HOOK": "http://hooks.example/x"}) == "http://hooks.example/x"
    with pytest.raises(ConfigError, match=r"\$TEAM_HOOK is not set"):
        from_env.url({})
    with pytest.raises(ConfigError, match=r"\$TEAM_HOOK: 'ftp://x' is not an http\(s\) URL"):
        from_env.url({"TEAM_HOOK": "ftp://x"})
    assert load(tmp_path, "experiments: [demo]\n").alert is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "problem"), [
    ("alert: {webhook: 'ftp://x'}\n", "nightly.yaml:1: alert.webhook: 'ftp://x' is not an http(s) URL"),
    ("alert:\n  webhook: 'http://x/y'\n  format: slak\n",
     "nightly.yaml:3: alert.format: Input should be 'slack', 'teams' or 'json'"),
    ("alert: {format: json}\n", "give exactly one of webhook (the URL) and webhook_env"),
    ("alert: {webhook: 'http://x', webhook_env: X}\n", "give exactly one of webhook"),
    ("alert: {webhook: 'http://x', channel: ops}\n", "alert.channel"),
])
def test_a_wrong_alert_is_refused_with_its_line(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, text)
    assert problem in str(raised.value)


def test_nightly_export_targets_validate_and_a_relative_tensorboard_dir_is_under_the_state_dir(tmp_path: Path
                                                                                             ) -> None:
    good = tmp_path / "nightly.yaml"
    good.write_text("export:\n  tensorboard: exports/tb\n  mlflow: http://mlflow:5000\n")
    export = load_nightly_settings(good).export
    assert export is not None
    assert export.wanted
    assert export.tensorboard_dir(tmp_path / "state") == tmp_path / "state" / "exports" / "tb"
    assert export.mlflow == "http://mlflow:5000"
    bad = tmp_path / "bad.yaml"
    bad.write_text("export:\n  tensorbord: exports/tb\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2.*tensorbord"):
        load_nightly_settings(bad)
