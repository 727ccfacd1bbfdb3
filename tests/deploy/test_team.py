"""End to end, real parts: PostgreSQL, `prefect server start`, `alignflow serve`, REST as the UI, headless Chromium.

The tests of this module share one team topology (`team` fixture) and build on each other in file order: the
UI-launched demo run is the passing baseline the nightly's first run finds (launched as the demo run's page is
opened in Chromium, waited for by the nightly's test); the nightly's first run is the baseline its second run
(after the `drifting` experiment was made to regress) is compared with; then a launch is cancelled from the UI
and `alignflow serve` is stopped with SIGTERM while a nightly is training; last, `prefect.yaml` is deployed to a
process work pool whose worker runs a launch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alignflow.convert.registry import SPEC_DIR
from alignflow.errors import RecordNotFound
from alignflow.store import Store
from tests.chromium import CHROMIUM, CHROMIUM_FLAGS
from tests.deploy.conftest import Team
from tests.deploy.team import Proc, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVERY_STEP = {"npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare"}


def launch(team: Team, flow_name: str, deployment: str, parameters: dict[str, Any]) -> str:
    found = team.server.deployment(flow_name, deployment)
    assert found is not None
    response = team.server.run_from_ui(found["id"], parameters)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture(scope="module")
def demo_run(team: Team) -> dict[str, Any]:
    """The demo experiment launched from the alignment deployment, exactly as the UI's Run button does."""
    flow_run_id = launch(team, "alignment", "launch", {"experiment": "demo"})
    return team.server.wait_final(flow_run_id, timeout_s=900, proc=team.serve)


NIGHTLY_PARAMS = {"config": {"experiments": ["demo", "drifting"]}}


@pytest.fixture(scope="module")
def first_nightly(team: Team, demo_run: dict[str, Any]) -> str:
    """The nightly's first run (both experiments, nothing changed: no regression), launched once the demo run is
    checked and left to run while its page is looked at in Chromium; the nightly's test waits for it."""
    return launch(team, "nightly-regression", "nightly", NIGHTLY_PARAMS)


def test_the_server_refuses_an_experiment_that_is_not_in_the_catalog(team: Team) -> None:
    deployment = team.server.deployment("alignment", "launch")
    assert deployment is not None
    schema = deployment["parameter_openapi_schema"]
    assert schema["definitions"]["ExperimentName"]["enum"] == ["demo", "drifting"]
    response = team.server.run_from_ui(deployment["id"], {"experiment": "no-such-experiment"})
    assert response.status_code == 409, response.text
    assert "no-such-experiment" in response.text
    for bad in ({"experiment": "demo", "parent": {"run_id": "ZZ"}},
                {"experiment": "demo", "steps": {"force": ["gpu_trian"]}},
                {"experiment": "demo", "steps": {"forse": ["gpu_train"]}}):
        refused = team.server.run_from_ui(deployment["id"], bad)
        assert refused.status_code == 409, (bad, refused.text)


def test_ui_run_of_the_demo_completes_and_the_store_on_postgres_holds_it(team: Team, demo_run: dict[str, Any]
                                                                          ) -> None:
    assert demo_run["state_type"] == "COMPLETED", team.server.logs(demo_run["id"])
    with Store.open(team.db_url, upgrade=False) as store:
        assert store.url.startswith("postgresql")
        runs = store.list_runs(experiment="demo")
        assert len(runs) == 1
        run = runs[0]
        assert demo_run["name"] == f"align-demo-{run.id}"  # issue 19: named for the alignflow run
        assert (run.status, run.verdict, run.trigger) == ("completed", "pass", "deployment")
        steps = {s.step: s for s in store.steps(run.id)}
        assert {name for name, s in steps.items() if s.status == "ran"} == EVERY_STEP
        artifacts = {a.name: a for a in store.run_artifacts(run.id)}
        assert {"base_ckpt", "bf16_ckpt", "megatron_ckpt", "gpu_log", "npu_log", "report"} <= set(artifacts)
        assert all(len(a.sha256) == 64 for a in artifacts.values())
        comparison = store.comparison(run.id)
        assert comparison is not None
        assert comparison.verdict == "pass"
        data_sha = steps["npu_base_train"].inputs["data"]["sha256"]
    assert run.report is not None
    assert Path(run.report).is_file()

    published = {a["key"]: a for a in team.server.artifacts(demo_run["id"])}
    assert {"demo-summary", "demo-metrics", "demo-report"} <= set(published)
    summary = published["demo-summary"]["data"]
    assert f"run `{run.id}`" in summary
    assert "**Verdict: PASS**" in summary
    assert data_sha in summary
    assert artifacts["megatron_ckpt"].sha256 in summary
    assert "6 ran" in summary
    metrics = published["demo-metrics"]["data"]
    assert "lm_loss" in str(metrics)
    link = published["demo-report"]["data"]  # a link artifact is stored as markdown: [text](url)
    assert link.startswith(f"[demo report (run {run.id})]({team.reports_url}/")
    page = httpx.get(link.split("](", 1)[1].rstrip(")"), timeout=30)
    assert page.status_code == 200
    assert 'class="plot" data-metric="lm_loss"' in page.text  # the interactive curves (plotly, inline)


def test_flow_run_page_in_chromium_shows_completed_and_the_report_artifact(
    team: Team, demo_run: dict[str, Any], first_nightly: str, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url = f"{team.server.url}/v2/runs/flow-run/{demo_run['id']}"
    shot = tmp_path / "flow-run-page.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, wait_until="domcontentloaded")
            expect(page.get_by_text("align-demo").first).to_be_visible(timeout=60_000)
            expect(page.get_by_text("Completed", exact=True).first).to_be_visible(timeout=60_000)
            page.get_by_role("tab", name="Artifacts").click()
            expect(page.get_by_text("demo-report").first).to_be_visible(timeout=60_000)
            page.screenshot(path=str(shot), full_page=True)
            # the summary artifact renders its markdown: verdict, criteria and fingerprint tables
            summary = next(a for a in team.server.artifacts(demo_run["id"]) if a["key"] == "demo-summary")
            page.goto(f"{team.server.url}/v2/artifacts/artifact/{summary['id']}", wait_until="domcontentloaded")
            expect(page.get_by_text("Verdict: PASS").first).to_be_visible(timeout=60_000)
            expect(page.get_by_role("heading", name="Fingerprints")).to_be_visible(timeout=60_000)
            page.screenshot(path=str(tmp_path / "summary-artifact.png"), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000


def test_nightly_on_demand_fails_and_names_the_experiment_that_regressed(team: Team, first_nightly: str) -> None:
    nightly = team.server.deployment("nightly-regression", "nightly")
    assert nightly is not None
    [schedule] = nightly["schedules"]
    assert (schedule["schedule"]["cron"], schedule["schedule"]["timezone"]) == ("0 2 * * *", "UTC")
    assert nightly["global_concurrency_limit"]["limit"] == 1  # one nightly at a time
    params = NIGHTLY_PARAMS

    first = team.server.wait_final(first_nightly, timeout_s=900, proc=team.serve)
    assert first["state_type"] == "COMPLETED", (first["state"]["message"], team.server.logs(first["id"]))
    assert "no regression" in first["state"]["message"]

    # Someone "simplifies" the conversion spec and drops the shared expert's fc1 de-interleave: names and shapes
    # still match, so the converter and Megatron accept it, and preflight has nothing to object to (both sides'
    # settings still agree) — only the curves part: the GPU side re-runs on mis-laid weights.
    spec = (SPEC_DIR / "twin-moe.yaml").read_text()
    broken = spec.replace("ops: [deinterleave_rows], shape: [2 * shared_ffn", "shape: [2 * shared_ffn")
    assert broken != spec
    (team.experiments / "specs").mkdir(exist_ok=True)
    (team.experiments / "specs" / "twin-moe-edited.yaml").write_text(broken)
    path = team.experiments / "drifting.yaml"
    experiment = yaml.safe_load(path.read_text())
    experiment["conversion"]["spec"] = "specs/twin-moe-edited.yaml"
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))

    second = team.server.wait_final(launch(team, "nightly-regression", "nightly", params), timeout_s=900,
                                    proc=team.serve)
    assert second["state_type"] == "FAILED", team.server.logs(second["id"])
    message = second["state"]["message"]
    assert "1 of 2 experiment(s) regressed: drifting" in message
    assert "demo" not in message.split("regressed:")[1]

    published = {a["key"]: a for a in team.server.artifacts(second["id"])}
    assert {"nightly-regressions", "nightly-criteria"} <= set(published)
    markdown = published["nightly-regressions"]["data"]
    rows = {line.split("|")[1].strip(): line for line in markdown.splitlines() if line.startswith("| ")}
    assert "**REGRESSED**" in rows["drifting"]
    assert "verdict fail" in rows["drifting"]
    assert rows["demo"].rstrip(" |").endswith("ok")
    with Store.open(team.db_url, upgrade=False) as store:
        drifting = store.list_runs(experiment="drifting")
        assert [(r.trigger, r.verdict) for r in drifting] == [("nightly", "fail"), ("nightly", "pass")]
        assert f"`{drifting[1].id}`" in rows["drifting"]  # compared with the last passing run
        statuses = {s.step: s.status for s in store.steps(drifting[0].id)}
    assert statuses["convert_megatron"] == "ran"
    assert statuses["gpu_train"] == "ran"
    assert statuses["npu_base_train"] == "cached"
    assert (second["state_name"], team.server.flow_run(first["id"])["state_name"]) == ("Regressed", "Completed")
    children = {c["name"]: c for c in team.server.child_runs(second["id"])}
    assert set(children) == {f"align-demo-{store_demo}" for store_demo in demo_ids(team)[:1]} | {
        f"align-drifting-{drifting[0].id}"}
    assert children[f"align-drifting-{drifting[0].id}"]["state_name"] == "Not aligned"
    # nightly.yaml's export: every run of both nightlies is in TensorBoard, both sides' curves (read back with
    # TensorBoard's own reader), the failing one too
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Store.open(team.db_url, upgrade=False) as store:
        nightly_runs = [r.id for r in store.list_runs(limit=1000) if r.trigger == "nightly"]
    assert len(nightly_runs) == 4
    for run_id in nightly_runs:  # one TensorBoard run per side (same tags: one chart each) and one of the error
        for run, tag in (("NPU", "lm_loss"), ("GPU", "lm_loss"), ("error", "error/lm_loss")):
            acc = EventAccumulator(str(team.state / "exports" / "tensorboard" / run_id / run),
                                   size_guidance={"tensors": 0})
            acc.Reload()
            assert tag in acc.Tags()["tensors"], (run_id, run)


def demo_ids(team: Team) -> list[str]:
    with Store.open(team.db_url, upgrade=False) as store:
        return [r.id for r in store.list_runs(experiment="demo")]


def live_in_group(pgid: int) -> list[int]:
    """Processes of a process group that are not zombies (`kill -0` would count zombies:
    docs/orchestration.md#g12-kill--0-is-true-for-zombies)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def test_cancel_from_the_ui_and_sigterm_stop_runs_in_flight_and_kill_their_jobs(team: Team, demo_run: dict[str, Any]
                                                                                 ) -> None:
    """A UI launch that re-runs the NPU base step is cancelled as the UI's Cancel button does; a nightly whose
    experiment now has a long NPU base step is still running when `alignflow serve` gets SIGTERM. Both jobs are
    killed, both runs recorded cancelled, and the nightly's schedule stays active."""
    # Both base steps last ten minutes, so each is still running when its cancel arrives (the runner notices a
    # cancelled flow run at its next poll, seconds later): the demo's forced base step as the flow reads it at
    # launch, then restored; the nightly's experiment, which no later test uses. What the jobs run does not matter
    # here, only that they are running: a command that waits costs the machine nothing, where two trainings kept
    # both of its cores busy for the minute this test takes.
    demo_path = team.experiments / "demo.yaml"
    demo_text = demo_path.read_text()
    _long_base_step(demo_path)
    try:
        launch_id = launch(team, "alignment", "launch", {"experiment": "demo", "steps": {"force": ["npu_base_train"]}})
        _long_base_step(team.experiments / "drifting.yaml", seconds=601)
        nightly_id = launch(team, "nightly-regression", "nightly", {"config": {"experiments": ["drifting"]}})
        _cancel_both(team, launch_id, nightly_id)
    finally:
        demo_path.write_text(demo_text)


def _long_base_step(path: Path, seconds: int = 600) -> None:
    """The experiment's NPU base step replaced by a job that waits ten minutes (preflight cannot read a replaced
    training command, so it is off, as for any such experiment). Two experiments get different waits: the same
    command on the same data is one training, run once while the other run waits for it (issue 49)."""
    experiment = yaml.safe_load(path.read_text())
    experiment.setdefault("steps", {})["npu_base_train"] = {"command": ["sleep", str(seconds)]}
    experiment["preflight"] = False
    path.write_text(yaml.safe_dump(experiment, sort_keys=False))


def _cancel_both(team: Team, launch_id: str, nightly_id: str) -> None:

    def running_job(name: str, trigger: str) -> dict[str, Any] | None:
        with Store.open(team.db_url, upgrade=False) as store:
            try:
                newest = store.list_runs(experiment=name, limit=1)[0]
            except RecordNotFound:  # its first run has not been recorded yet
                return None
            if newest.trigger != trigger or newest.status != "running":
                return None
            return next((s.job_handle for s in store.steps(newest.id) if s.job_handle and s.status == "running"),
                        None)

    jobs = [wait_until(f"{name}'s training job", lambda n=name, t=trigger: running_job(n, t), timeout_s=300,
                       proc=team.serve) for name, trigger in (("demo", "deployment"), ("drifting", "nightly"))]
    try:
        assert all(live_in_group(job["pgid"]) for job in jobs)
        cancel = team.server.client.post(f"/flow_runs/{launch_id}/set_state", json={
            "state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True})
        assert cancel.status_code in (200, 201), cancel.text
        assert team.server.wait_final(launch_id, timeout_s=120)["state_type"] == "CANCELLED"
        wait_until("the cancelled launch's job to be gone", lambda: not live_in_group(jobs[0]["pgid"]), timeout_s=30)
        assert live_in_group(jobs[1]["pgid"])  # the nightly trains on

        assert team.serve.stop() == 0, team.serve.tail()
        assert team.server.wait_final(nightly_id, timeout_s=120)["state_type"] == "CANCELLED"
        wait_until("the nightly's job to be gone", lambda: not live_in_group(jobs[1]["pgid"]), timeout_s=30)
    finally:
        for job in jobs:  # never leave a training behind, whatever failed above
            for pid in live_in_group(job["pgid"]):
                os.kill(pid, signal.SIGKILL)
    with Store.open(team.db_url, upgrade=False) as store:
        for name in ("demo", "drifting"):
            run = store.list_runs(experiment=name, limit=1)[0]
            assert run.status == "cancelled", name
            step = next(s for s in store.steps(run.id) if s.step == "npu_base_train")
            assert step.status == "cancelled"  # neither ran nor failed: the run was cancelled while it trained
            assert "cancelled" in (step.error or ""), step.error
        # the nightly's flow run killed its job itself on the SIGTERM `alignflow serve` passed on (and so could
        # exit): not the cancellation hook after Prefect's 30 s grace and a SIGKILL, its step waiting all along;
        # the flow took the SIGTERM itself (flows.alignment._sigterm_cancels), and saw the job end
        nightly_step = next(s for s in store.steps(store.list_runs(experiment="drifting", limit=1)[0].id)
                            if s.step == "npu_base_train")
        assert nightly_step.error == "cancelled: stopped (SIGTERM); its job was killed", nightly_step.error
    nightly = team.server.deployment("nightly-regression", "nightly")
    assert nightly is not None
    assert nightly["paused"] is False
    assert all(s["active"] for s in nightly["schedules"])


def test_prefect_yaml_deploys_to_a_process_pool_whose_worker_runs_the_ui_form(team: Team, repo_root: Path,
                                                                             demo_run: dict[str, Any]) -> None:
    """The `prefect.yaml` path, after `alignflow serve` stopped: deploy, start a process worker, launch the demo
    (cached by now: the point is the worker loading the flow from its entry point, not training again)."""
    (team.root / "flows").symlink_to(repo_root / "flows")  # the layout of a checkout: flows/ beside experiments/
    shutil.copy(repo_root / "prefect.yaml", team.root / "prefect.yaml")
    env = {**team.env, "PREFECT_HOME": str(team.root / "prefect-pool"), "ALIGNFLOW_HOME": str(team.root),
           "PREFECT_WORKER_QUERY_SECONDS": "2"}
    prefect = [sys.executable, "-m", "prefect"]
    for argv in (["work-pool", "create", "alignflow", "--type", "process"], ["--no-prompt", "deploy", "--all"]):
        done = subprocess.run([*prefect, *argv], env=env, cwd=team.root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    launch_dep = team.server.deployment("alignment", "launch")
    nightly = team.server.deployment("nightly-regression", "nightly")
    assert launch_dep is not None
    assert nightly is not None
    assert launch_dep["work_pool_name"] == "alignflow"
    assert launch_dep["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {
        "directory": str(team.root)}}]
    assert launch_dep["parameter_openapi_schema"]["definitions"]["ExperimentName"]["enum"] == ["demo", "drifting"]
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in nightly["schedules"]] == [("0 2 * * *", "UTC")]
    assert nightly["global_concurrency_limit"]["limit"] == 1

    worker = Proc.start("prefect worker", [*prefect, "worker", "start", "--pool", "alignflow", "--type", "process"],
                        env=env, cwd=team.root, log=team.root / "logs" / "worker.log")
    try:
        flow_run_id = launch(team, "alignment", "launch", {"experiment": "demo"})
        done_run = team.server.wait_final(flow_run_id, timeout_s=600, proc=worker)
    finally:
        # Prefect's process worker turns the SIGTERM into a SIGINT to itself and then, after a completed flow run,
        # at times sits a minute in its teardown (seen in 2 of 3 make test runs: the test took 72 s instead of 12 s).
        # How it stops is not what this test is about: 10 s, then SIGKILL to its group.
        worker.stop(grace_s=10)
    assert done_run["state_type"] == "COMPLETED", (worker.tail(), team.server.logs(flow_run_id))
    assert done_run["work_pool_name"] == "alignflow"
    with Store.open(team.db_url, upgrade=False) as store:
        newest = store.list_runs(experiment="demo", limit=1)[0]
        assert newest.trigger == "deployment"
        assert {s.status for s in store.steps(newest.id)} == {"cached"}
