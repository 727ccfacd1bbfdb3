"""`alignflow serve`: what it would register (--dry-run), and every input it refuses before registering anything.

The served process itself (against a real server, stopped by SIGTERM) is in test_team.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.errors import ConfigError
from tests.deploy.team import free_port


@pytest.fixture
def workspace(tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "experiments").mkdir()
    shutil.copy(repo_root / "experiments" / "demo.yaml", tmp_path / "experiments" / "demo.yaml")
    tiny = yaml.safe_load((repo_root / "tests" / "data" / "flow" / "tiny.yaml").read_text())
    tiny.update(name="tiny", conversion={"spec": "twin-moe"})
    (tmp_path / "experiments" / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    shutil.copy(repo_root / "hosts.yaml", tmp_path / "hosts.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def dry_run(*args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(app, ["serve", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return list(json.loads(result.output))


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, ["serve", "--dry-run", *args])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError), result.output
    return str(result.exception)


def test_dry_run_lists_the_ui_form_and_the_nightly_schedule(workspace: Path) -> None:
    launch, nightly = dry_run()
    assert launch["name"] == "alignment/launch"
    assert launch["schedules"] == []
    assert launch["parameters"] == ["experiment", "steps", "parent"]
    defs = launch["schema"]["definitions"]
    assert defs["ExperimentName"]["enum"] == ["demo", "tiny"]  # built from experiments/*.yaml when serving
    assert "compare" in defs["StepName"]["enum"]
    assert defs["ParentRun"]["properties"]["run_id"]["pattern"] == "^[0-9a-f]{4,12}$"
    assert launch["schema"]["required"] == ["experiment"]
    assert nightly["name"] == "nightly-regression/nightly"
    assert nightly["schedules"] == [{"cron": "0 2 * * *", "timezone": "UTC"}]
    config = nightly["schema"]["properties"]["config"]
    assert config["default"]["experiments"] == ["demo", "tiny"]
    assert nightly["schema"]["definitions"]["NightlyConfig"]["properties"]["experiments"]["minItems"] == 1


def test_nightly_yaml_sets_experiments_schedule_and_drift_and_options_override_it(workspace: Path) -> None:
    (workspace / "nightly.yaml").write_text(
        "experiments: [tiny]\ncron: '30 1 * * 1-5'\ntimezone: Asia/Shanghai\n"
        "drift:\n  default: {relative: 0.2, of_threshold: 0.05}\n  overrides:\n    me(grad_norm): {relative: 1.0}\n")
    _, nightly = dry_run()
    assert nightly["schedules"] == [{"cron": "30 1 * * 1-5", "timezone": "Asia/Shanghai"}]
    default = nightly["schema"]["properties"]["config"]["default"]
    assert default["experiments"] == ["tiny"]
    assert default["drift"]["default"] == {"relative": 0.2, "of_threshold": 0.05}
    assert default["drift"]["overrides"]["me(grad_norm)"]["relative"] == 1.0
    _, nightly = dry_run("--timezone", "Europe/Berlin", "--nightly-experiment", "demo")
    assert nightly["schedules"][0]["timezone"] == "Europe/Berlin"
    assert nightly["schema"]["properties"]["config"]["default"]["experiments"] == ["demo"]


def test_refuses_a_nightly_experiment_that_does_not_exist(workspace: Path) -> None:
    message = refused("--nightly-experiment", "demo", "--nightly-experiment", "dmeo")
    assert "experiments: unknown 'dmeo'" in message
    assert "has: demo, tiny" in message


def test_refuses_an_unknown_time_zone_and_a_bad_cron(workspace: Path) -> None:
    assert "unknown time zone 'Asia/Shanghia'" in refused("--timezone", "Asia/Shanghia")
    assert "cron '0 25 * * *'" in refused("--cron", "0 25 * * *")
    (workspace / "nightly.yaml").write_text("experiments: [demo]\ntimezone: Mars/Olympus\n")
    message = refused()
    assert message == ("nightly.yaml:2: timezone: unknown time zone 'Mars/Olympus'; "
                       "use an IANA name such as UTC or Asia/Shanghai")


def test_refuses_to_offer_a_broken_experiment_and_names_every_problem(workspace: Path) -> None:
    broken = workspace / "experiments" / "broken.yaml"
    broken.write_text("name: broken\nmodel: {}\n")
    (workspace / "experiments" / "elsewhere.yaml").write_text(
        (workspace / "experiments" / "tiny.yaml").read_text().replace("name: tiny", "name: elsewhere")
        + "hosts: {cuda: gpu-9}\n")
    message = refused()
    assert f"{broken}:" in message
    assert "hosts.cuda: unknown host 'gpu-9'" in message  # checked against the inventory being served


def test_refuses_an_empty_or_missing_experiments_directory(workspace: Path) -> None:
    assert "experiments directory not found" in refused("--experiments", "nope")
    (workspace / "empty").mkdir()
    assert "no experiment files" in refused("--experiments", "empty")


def run_serve(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", "serve"], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_serving_needs_a_prefect_server_and_says_so(workspace: Path, subprocess_env: dict[str, str]) -> None:
    env = {k: v for k, v in subprocess_env.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(workspace / "prefect-home")
    done = run_serve(env, workspace)
    assert done.returncode == 1
    assert "PREFECT_API_URL is not set" in done.stderr
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    done = run_serve(env, workspace)
    assert done.returncode == 1
    assert "Prefect server not reachable" in done.stderr


def test_pool_entry_points_are_only_the_two_flows() -> None:
    import flows.serve

    with pytest.raises(AttributeError, match="no attribute 'launch'"):
        _ = flows.serve.launch  # type: ignore[attr-defined]


def test_the_form_maps_onto_the_alignment_flows_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a UI launch hands the alignment flow (the one fake here stands for the flow body, run end to end in
    test_team.py)."""
    import flows.launch as launch

    seen: dict[str, Any] = {}

    class AlignmentBody:
        @staticmethod
        def fn(**kwargs: Any) -> dict[str, Any]:
            seen.update(kwargs)
            return {"run_id": "r"}

    monkeypatch.setattr(launch, "alignment_flow", AlignmentBody)
    steps = launch.StepSelection.model_validate({"from_step": "gpu_train", "force": ["compare"]})
    parent = launch.ParentRun(run_id="abcd1234", reuse_artifacts=True)
    assert launch.run_alignment(Path("/x/e.yaml"), Path("/x/hosts.yaml"), steps, parent) == {"run_id": "r"}
    assert seen == {"experiment": "/x/e.yaml", "hosts": "/x/hosts.yaml", "from_step": "gpu_train", "only": None,
                    "force": ["compare"], "parent_run": "abcd1234", "reuse_parent": True, "trigger": "deployment"}
    launch.run_alignment(Path("/x/e.yaml"), Path("/x/hosts.yaml"), launch.StepSelection(), None)
    assert (seen["from_step"], seen["force"], seen["parent_run"], seen["reuse_parent"]) == (None, None, None, False)
    with pytest.raises(ValueError, match="gpu_trian"):
        launch.StepSelection.model_validate({"only": ["gpu_trian"]})
