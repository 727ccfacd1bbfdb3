"""`alignflow serve`: what it would register (--dry-run), and every input it refuses before registering anything.

The served process itself (against a real server, stopped by SIGTERM) is in test_team.py.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from alignflow import pipeline
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


@pytest.mark.integration
def test_dry_run_lists_the_ui_form_and_the_nightly_schedule(workspace: Path) -> None:
    launch, nightly = dry_run()
    assert launch["name"] == "alignment/launch"
    assert launch["schedules"] == []
    assert launch["parameters"] == ["experiment", "steps", "parent"]
    defs = launch["schema"]["definitions"]
    assert defs["ExperimentName"]["enum"] == ["demo", "tiny"]  # built from experiments/*.yaml when serving
    assert launch["schema"]["properties"]["experiment"]["default"] == "demo"  # pre-selected
    assert offered_steps(launch["schema"]) == EVERY_STEP
    assert defs["ParentRun"]["properties"]["run_id"]["pattern"] == "^([0-9a-f]{4,12})?$"  # empty: no parent
    assert launch["schema"]["required"] == []
    assert_clean_form(launch["schema"])
    assert nightly["name"] == "nightly-regression/nightly"
    assert nightly["schedules"] == [{"cron": "0 2 * * *", "timezone": "UTC"}]
    config = nightly["schema"]["properties"]["config"]
    assert config["default"]["experiments"] == ["demo", "tiny"]
    assert nightly["schema"]["definitions"]["NightlyConfig"]["properties"]["experiments"]["minItems"] == 1


@pytest.mark.integration
def test_the_form_offers_the_steps_the_served_experiments_pipelines_have(workspace: Path, repo_root: Path) -> None:
    """A Megatron-against-Megatron experiment has no conversion step, a Hugging Face base no base training: the
    form's step names are those of the served experiments' derived pipelines, in pipeline order."""
    for name in ("demo.yaml", "tiny.yaml"):
        (workspace / "experiments" / name).unlink()
    for name in ("demo-same-format.yaml", "demo-hf-base.yaml"):
        shutil.copy(repo_root / "experiments" / name, workspace / "experiments" / name)
    launch, _ = dry_run()
    assert offered_steps(launch["schema"]) == ["npu_base_train", "convert_mindformers", "convert_megatron",
                                               "early_gate", "gpu_train", "npu_reload_train", "compare", "diagnose"]
    (workspace / "experiments" / "demo-hf-base.yaml").unlink()
    launch, _ = dry_run()
    assert offered_steps(launch["schema"]) == ["npu_base_train", "early_gate", "gpu_train", "npu_reload_train",
                                               "compare", "diagnose"]


# the steps of the served experiments (demo, tiny: the classic pipeline, derived from their checkpoint formats); the
# planner enables an optional step a launch names (Pipeline.plan)
EVERY_STEP = list(pipeline.DEFAULT.names)


def offered_steps(schema: dict[str, Any]) -> list[str]:
    """The steps each field of the `steps` sub-form offers (the same for the three), each field's own enum: the UI
    labels a dropdown with its item schema's title, which for a shared `StepName` definition was `Select StepName`
    on two fields."""
    fields = schema["definitions"]["StepSelection"]["properties"]
    offered = [fields["from_step"]["enum"], fields["only"]["items"]["enum"], fields["force"]["items"]["enum"]]
    assert "$ref" not in json.dumps(fields)
    assert offered[0] == offered[1] == offered[2]
    return list(offered[0])


@pytest.mark.integration
def test_the_form_lists_the_demo_first_and_pre_selects_it(workspace: Path) -> None:
    first = yaml.safe_load((workspace / "experiments" / "tiny.yaml").read_text())
    first.update(name="a-first")
    (workspace / "experiments" / "a-first.yaml").write_text(yaml.safe_dump(first))  # before demo in the catalog
    launch, _ = dry_run()
    assert launch["schema"]["definitions"]["ExperimentName"]["enum"] == ["demo", "a-first", "tiny"]
    assert launch["schema"]["properties"]["experiment"]["default"] == "demo"


def assert_clean_form(schema: dict[str, Any]) -> None:
    """Issue 19: every field of the form titled and described, no optional field as a `null` branch (the UI draws a
    type toggle for it, and posts `null`, which the server then refuses), no `<...>` the UI would strip."""
    text = json.dumps(schema)
    assert '"type": "null"' not in text
    assert "anyOf" not in text
    assert "<" not in text
    assert "Field" not in text
    for name, prop in schema["properties"].items():
        ref = schema["definitions"].get(prop.get("$ref", "").rsplit("/", 1)[-1], {})
        assert prop.get("title") or ref.get("title"), name
        assert prop.get("description"), name
    for model in ("StepSelection", "ParentRun"):
        for name, prop in schema["definitions"][model]["properties"].items():
            assert prop.get("title"), (model, name)
            assert prop.get("description"), (model, name)
            assert prop.get("default", "absent") is not None, (model, name)  # no null default either
    assert schema["properties"]["steps"]["default"] == {"only": [], "force": []}
    assert schema["properties"]["parent"]["default"] == {"reuse_artifacts": True}


@pytest.mark.integration
def test_nightly_yaml_sets_experiments_schedule_and_drift_and_options_override_it(workspace: Path) -> None:
    (workspace / "nightly.yaml").write_text(
        "experiments: [tiny]\ncron: '30 1 * * 1-5'\ntimezone: Asia/Shanghai\n"
        "drift:\n  default: {relative: 0.2, of_threshold: 0.05}\n  overrides:\n    me(grad_norm): {relative: 1.0}\n"
        "export: {tensorboard: exports/tb}\n")
    _, nightly = dry_run()
    assert nightly["schedules"] == [{"cron": "30 1 * * 1-5", "timezone": "Asia/Shanghai"}]
    default = nightly["schema"]["properties"]["config"]["default"]
    assert default["experiments"] == ["tiny"]
    assert default["export"] == {"tensorboard": "exports/tb", "mlflow": None}
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
    message = refused()
    assert f"{broken}:1: data: required key is missing" in message
    assert f"{broken}:1: training: required key is missing" in message


def elsewhere(workspace: Path) -> Path:
    """A valid experiment whose GPU host is a team machine this inventory does not have (like the committed GLM
    and Qwen experiments on a fresh clone)."""
    path = workspace / "experiments" / "elsewhere.yaml"
    path.write_text((workspace / "experiments" / "tiny.yaml").read_text().replace("name: tiny", "name: elsewhere")
                    + "hosts: {cuda: gpu-9}\n")
    return path


@pytest.mark.integration  # Prefect's cron check starts a process
def test_an_experiment_whose_hosts_the_inventory_lacks_is_listed_as_not_served_with_why(workspace: Path) -> None:
    line = len(elsewhere(workspace).read_text().splitlines())
    launch, _ = dry_run()
    assert launch["schema"]["definitions"]["ExperimentName"]["enum"] == ["demo", "tiny"]
    assert launch["not_served"] == [{
        "experiment": "elsewhere", "path": str(workspace / "experiments" / "elsewhere.yaml"),
        "reasons": [f"elsewhere.yaml:{line}: hosts.cuda: unknown host 'gpu-9'",
                    "hosts.yaml defines: ascend, cpu, cuda"]}]
    shown = CliRunner().invoke(app, ["serve", "--dry-run"])
    assert shown.exit_code == 0, shown.output
    assert f"not served:  elsewhere: elsewhere.yaml:{line}: hosts.cuda: unknown host 'gpu-9'; hosts.yaml defines: " in (
        " ".join(shown.output.split()).replace("not served: ", "not served:  "))
    # the nightly may not silently lose it
    message = refused("--nightly-experiment", "elsewhere")
    assert message.startswith(f"--nightly-experiment: experiments: 'elsewhere' is not served: elsewhere.yaml:{line}: "
                              "hosts.cuda: unknown host 'gpu-9'")


@pytest.mark.integration
def test_serve_on_the_committed_checkout_serves_the_demo_and_lists_the_rest(repo_root: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)
    launch, nightly = dry_run()
    # the experiments whose hosts the committed hosts.yaml has (its three local hosts)
    assert launch["schema"]["definitions"]["ExperimentName"]["enum"] == ["demo", "demo-hf-base", "demo-matrix",
                                                                         "demo-megatron", "demo-same-format",
                                                                         "mindformers-cpu"]
    assert launch["schema"]["properties"]["experiment"]["default"] == "demo"  # `make demo`'s: listed first, chosen
    # the demo's steps and demo-hf-base's conversion of its Hugging Face base to the MindSpore twin's format
    assert offered_steps(launch["schema"]) == ["npu_base_train", "convert_bf16", "convert_mindformers",
                                               *EVERY_STEP[2:]]
    assert EVERY_STEP[1:3] == ["convert_bf16", "convert_megatron"]
    assert {u["experiment"] for u in launch["not_served"]} == {"glm52_1b", "glm52_mini", "qwen35_dense",
                                                               "qwen35_moe"}
    assert all(any("unknown host 'npu-a'" in r for r in u["reasons"]) for u in launch["not_served"])
    assert nightly["schema"]["properties"]["config"]["default"]["experiments"] == ["demo"]


def test_validate_with_hosts_checks_what_serve_checks(workspace: Path) -> None:
    line = len(elsewhere(workspace).read_text().splitlines())
    done = CliRunner().invoke(app, ["validate", "--hosts", "hosts.yaml"])
    assert done.exit_code == 0, done.output
    assert f"not served with hosts.yaml: elsewhere: elsewhere.yaml:{line}: hosts.cuda: unknown host 'gpu-9'" in (
        done.output)
    assert "serve offers: demo, tiny; nightly runs: demo, tiny" in done.output
    # what stops serve stops validate --hosts, with the same message
    (workspace / "nightly.yaml").write_text("experiments: [elsewhere]\n")
    stopped = CliRunner().invoke(app, ["validate", "--hosts", "hosts.yaml"])
    assert stopped.exit_code == 2  # a configuration error
    assert f"nightly.yaml: experiments: 'elsewhere' is not served: elsewhere.yaml:{line}:" in stopped.output
    assert refused().startswith(f"nightly.yaml: experiments: 'elsewhere' is not served: elsewhere.yaml:{line}:")
    (workspace / "nightly.yaml").write_text("experiments: [demo]\nalert: {webhook_env: NO_SUCH_VARIABLE_19}\n")
    stopped = CliRunner().invoke(app, ["validate", "--hosts", "hosts.yaml"])
    assert stopped.exit_code == 2
    assert "alert.webhook_env: $NO_SUCH_VARIABLE_19 is not set" in stopped.output
    assert "alert.webhook_env: $NO_SUCH_VARIABLE_19 is not set" in refused()


def test_refuses_an_empty_or_missing_experiments_directory(workspace: Path) -> None:
    assert "experiments directory not found" in refused("--experiments", "nope")
    (workspace / "empty").mkdir()
    assert "no experiment files" in refused("--experiments", "empty")


def run_serve(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "alignflow", "serve"], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.integration
def test_serving_needs_a_prefect_server_and_says_so(workspace: Path, subprocess_env: dict[str, str]) -> None:
    env = {k: v for k, v in subprocess_env.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(workspace / "prefect-home")
    env["ALIGNFLOW_STATE_DIR"] = str(workspace / "state")  # keeps no Prefect server
    done = run_serve(env, workspace)
    assert done.returncode == 2  # a configuration error
    assert "PREFECT_API_URL is not set and no Prefect server is kept" in done.stderr
    assert "alignflow server start" in done.stderr
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    done = run_serve(env, workspace)
    assert done.returncode == 2
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
    # what the UI's form posts when nothing is filled in (issue 19: no nulls), and a cleared run id
    for posted in ({"reuse_artifacts": True}, {"run_id": "", "reuse_artifacts": True}):
        launch.run_alignment(Path("/x/e.yaml"), Path("/x/hosts.yaml"),
                             launch.StepSelection.model_validate({"only": [], "force": []}),
                             launch.ParentRun.model_validate(posted))
        assert (seen["parent_run"], seen["reuse_parent"]) == (None, False)
    with pytest.raises(ValueError, match="gpu_trian"):
        launch.StepSelection.model_validate({"only": ["gpu_trian"]})


@pytest.mark.parametrize("field", ["only", "from_step", "force"])
def test_every_step_the_form_offers_starts_a_run(field: str, tmp_path: Path, repo_root: Path) -> None:
    """Issue 40: picking `diagnose` or `early_gate` in the form ended the flow run Not started (the plan refused an
    optional step the experiment had not enabled). Each step the form's enum offers, in each field, is recorded
    as a run whose plan executes it (what the flow body does first, `start_run`)."""
    import flows.launch as launch
    from alignflow.runner.run import start_run
    from alignflow.runner.session import RunOptions, open_run
    from alignflow.store import Store
    from tests.flows.conftest import make_flow_env

    env = make_flow_env(tmp_path / "exp", repo_root)
    with Store.open(state_dir=env.state) as store:
        for step in EVERY_STEP:  # what the form offers (test_dry_run_lists_the_ui_form_and_the_nightly_schedule)
            picked: Any = launch.StepSelection.model_validate({field: step if field == "from_step" else [step]})
            options = RunOptions(from_step=picked.from_step, only=tuple(picked.only), force=tuple(picked.force))
            plan = open_run(store, start_run(env.experiment, env.hosts, store=store, state_dir=env.state,
                                             options=options)).plan
            assert step in plan.steps, (field, step)
            assert step not in plan.reuse_only, (field, step)


def test_serve_polls_for_launched_runs_every_2_s_unless_the_user_set_prefects_poll_frequency() -> None:
    """A run submitted from the UI's form starts at serve's next poll: Prefect's 10 s default left it Scheduled for
    up to 10 s. A poll frequency the user set (environment or profile) is theirs."""
    from prefect.settings import PREFECT_RUNNER_POLL_FREQUENCY, temporary_settings

    from flows.serve import poll_seconds

    assert poll_seconds() == 2.0
    with temporary_settings({PREFECT_RUNNER_POLL_FREQUENCY: 7}):
        assert poll_seconds() is None  # the Runner then reads the user's 7 s itself


STUCK_STOP = """
import subprocess, sys, threading, time
from flows.serve import _stop_within

class Runner:  # a runner told to stop that never gets there (what Prefect's Runner says of itself)
    stopping = True

def stuck_in_the_runner() -> None:
    time.sleep(60)

flow_run = subprocess.Popen(["sleep", "299.5"])  # a flow-run process serve started
print(flow_run.pid, flush=True)
threading.Thread(target=_stop_within, args=(Runner(), float(sys.argv[1]), threading.Event()), daemon=True).start()
stuck_in_the_runner()
"""


@pytest.mark.integration
def test_a_serve_that_does_not_stop_in_time_shows_where_it_waited_kills_its_processes_and_exits_130(
        repo_root: Path, subprocess_env: dict[str, str]) -> None:
    """Ctrl-C or SIGTERM that the runner does not finish within its grace (a Ctrl-C as a flow run ended, under load,
    once left serve running for minutes): the stacks of its threads, no process left behind, exit 130."""
    done = subprocess.run([sys.executable, "-c", STUCK_STOP, "1"], cwd=repo_root, env=subprocess_env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 130, done.stderr
    assert "did not stop within 1 s" in done.stderr
    assert "in stuck_in_the_runner" in done.stderr  # faulthandler's dump of every thread: where the main one waits
    pid = int(done.stdout.split()[0])
    with contextlib.suppress(OSError):  # gone, a zombie, or the pid already another process's (a busy machine)
        stat, cmdline = (Path(f"/proc/{pid}") / "stat").read_text(), (Path(f"/proc/{pid}") / "cmdline").read_bytes()
        assert stat.rpartition(")")[2].split()[0] == "Z" or cmdline != b"sleep\x00299.5\x00", (stat, cmdline)


@pytest.mark.integration
def test_a_second_serve_of_one_state_dir_reports_the_first_and_ends(workspace: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from alignflow import controller
    from alignflow.once import unless_held

    monkeypatch.setenv("ALIGNFLOW_STATE_DIR", str(workspace / "state"))
    with unless_held(workspace / "state" / "serve.lock", what="alignflow serve") as other:  # the first serve
        assert other is None
        second = CliRunner().invoke(app, ["serve"])
    assert second.exit_code == 0, second.output
    assert "already serving: `alignflow serve` of state dir" in second.output
    assert f"({controller.current().describe()})" in second.output
