"""What a person sees in the Prefect UI (issue 19), in a real browser against real parts.

`prefect server start` (its own SQLite database), `alignflow serve` (deployments, the read-only reports server,
the nightly's alert), a webhook receiver on a local port, and Debian's Chromium driven by Playwright. A workspace
with two experiments that share everything but their criteria: `tiny` (default criteria, passes) and `strict`
(a criterion no run can meet, so its verdict is fail; its trainings are reused from `tiny`'s run).

In file order: `tiny` launched as the UI's Run button does (everything runs), `strict` (Not aligned), `tiny` again
from the run form in Chromium (everything cached) while a nightly of `strict` runs, then the pages of those runs,
then that nightly, which regresses and must reach the webhook. Screenshots go to `$ALIGNFLOW_SCREENSHOTS` when set.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from alignflow.store import Store
from tests.chromium import CHROMIUM
from tests.deploy.team import PrefectServer, Proc, free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVERY_STEP = ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare")
STRICT = {"metric": "grad_norm", "statistic": "max_abs", "threshold": 1.0e-30}  # no two runs meet it


class Hooks(ThreadingHTTPServer):
    """A webhook receiver: every POSTed JSON body, in order."""

    def __init__(self) -> None:
        self.received: queue.Queue[dict[str, Any]] = queue.Queue()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(handler) -> None:  # `self` is the receiver, the handler is `handler`
                body = handler.rfile.read(int(handler.headers.get("content-length") or 0))
                self.received.put({"path": handler.path, "json": json.loads(body or b"null")})
                handler.send_response(200)
                handler.end_headers()

            def log_message(handler, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


@dataclass
class UI:
    root: Path
    server: PrefectServer
    serve: Proc
    hooks: Hooks
    state: Path
    reports_url: str
    shots: Path

    def launch(self, flow_name: str, deployment: str, parameters: dict[str, Any]) -> str:
        found = self.server.deployment(flow_name, deployment)
        assert found is not None
        # SQLite under load: the server answers 503 while its database is locked; the UI (and Prefect's client)
        # retries those, and so does this.
        response = wait_until("the server to accept the flow run", lambda: (r := self.server.run_from_ui(
            found["id"], parameters)).status_code != 503 and r, timeout_s=120, proc=self.serve, every_s=2.0)
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def finished(self, flow_run_id: str, timeout_s: float = 1200) -> dict[str, Any]:
        return self.server.wait_final(flow_run_id, timeout_s=timeout_s, proc=self.serve)

    def task_runs(self, flow_run_id: str) -> dict[str, dict[str, Any]]:
        r = self.server.client.post("/task_runs/filter", json={"task_runs": {"flow_run_id": {"any_": [flow_run_id]}}})
        r.raise_for_status()
        return {t["name"]: t for t in r.json()}

    def artifacts(self, flow_run_id: str) -> dict[str, dict[str, Any]]:
        return {a["key"]: a for a in self.server.artifacts(flow_run_id) if a["key"]}

    def newest_run(self, experiment: str) -> Any:
        with Store.open(state_dir=self.state, upgrade=False) as store:
            return store.list_runs(experiment=experiment, limit=1)[0]

    def run(self, run_id: str) -> Any:
        with Store.open(state_dir=self.state, upgrade=False) as store:
            return store.get_run(run_id)


def write_workspace(root: Path, repo_root: Path, webhook: str) -> None:
    (root / "experiments").mkdir(parents=True)
    tiny = yaml.safe_load((repo_root / "tests" / "data" / "flow" / "tiny.yaml").read_text())
    tiny["conversion"] = {"spec": "twin-moe"}
    (root / "experiments" / "tiny.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    strict = {**tiny, "name": "strict", "description": "The tiny twin held to a criterion no run can meet.",
              "criteria": [{"metric": "lm_loss", "statistic": "me", "threshold": 0.001}, STRICT]}
    (root / "experiments" / "strict.yaml").write_text(yaml.safe_dump(strict, sort_keys=False))
    shutil.copy(repo_root / "hosts.yaml", root / "hosts.yaml")
    (root / "nightly.yaml").write_text(f"experiments: [strict]\nalert: {{webhook: '{webhook}', format: json}}\n")


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, subprocess_env: dict[str, str]) -> Iterator[UI]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    root = tmp_path_factory.mktemp("ui")
    hooks = Hooks()
    write_workspace(root, repo_root, hooks.url)
    shots = Path(os.environ.get("ALIGNFLOW_SCREENSHOTS") or root / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in subprocess_env.items() if k not in ("ALIGNFLOW_REPORTS_URL", "ALIGNFLOW_DB_URL")}
    started: list[Proc] = []
    server: PrefectServer | None = None
    try:
        server = PrefectServer.start(database_url=f"sqlite+aiosqlite:///{root / 'prefect-server' / 'prefect.db'}",
                                     home=root / "prefect-server", env=base, log=root / "logs" / "prefect-server.log")
        started.append(server.proc)
        port = free_port()
        env = {**base, "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(root / "prefect-serve"),
               "ALIGNFLOW_STATE_DIR": str(root / "state"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "GLOG_v": "3"}
        serve = Proc.start("alignflow serve", [sys.executable, "-m", "alignflow", "serve", "--reports-port", str(port)],
                           env=env, cwd=root, log=root / "logs" / "serve.log")
        started.append(serve)
        for flow_name, name in (("alignment", "launch"), ("nightly-regression", "nightly")):
            wait_until(f"deployment {flow_name}/{name}", lambda f=flow_name, n=name: server.deployment(f, n),
                       timeout_s=180, proc=serve)
        yield UI(root=root, server=server, serve=serve, hooks=hooks, state=root / "state",
                 reports_url=f"http://127.0.0.1:{port}", shots=shots)
    finally:
        for proc in reversed(started):
            proc.stop()
        if server is not None:
            server.client.close()
        hooks.close()


@pytest.fixture(scope="module")
def passing(ui: UI) -> dict[str, Any]:
    """`tiny`, launched as the UI's Run button does: every step runs, the verdict is pass."""
    return ui.finished(ui.launch("alignment", "launch", {"experiment": "tiny"}))


@pytest.fixture(scope="module")
def failing(ui: UI, passing: dict[str, Any]) -> dict[str, Any]:
    """`strict`: the trainings come from `tiny`'s run, the comparison runs and fails."""
    return ui.finished(ui.launch("alignment", "launch", {"experiment": "strict"}))


@pytest.fixture(scope="module")
def nightly_in_flight(ui: UI, failing: dict[str, Any]) -> str:
    """The nightly of `strict`, launched once `strict`'s run is judged (what it regresses against) and left to run
    while the form's run and the pages are looked at; the last test waits for it. Its `strict` run is newer than
    `failing`'s from here on: the tests after this one name `failing`'s run by its flow run's name."""
    return ui.launch("nightly-regression", "nightly", {})


@pytest.fixture(scope="module")
def from_the_form(ui: UI, passing: dict[str, Any], browser: Any) -> dict[str, Any]:
    """`tiny` again, submitted from the deployment's run form in Chromium: everything is reused."""
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.set_default_timeout(60_000)
    try:
        deployment = ui.server.deployment("alignment", "launch")
        assert deployment is not None
        page.goto(f"{ui.server.url}/v2/deployments/deployment/{deployment['id']}/run", wait_until="networkidle")
        for label in ("Experiment", "Steps", "Re-execute from", "Only these steps", "Force", "Parent run", "Run id",
                      "Reuse its artifacts"):  # each field's own title (the UI marks optional ones so)
            page.get_by_text(re.compile(rf"^{re.escape(label)}( \(Optional\))?$")).first.wait_for()
        body = page.locator("main").inner_text() if page.locator("main").count() else page.inner_text("body")
        assert "Field" not in body  # every field has its own title
        assert 'type "None"' not in body  # no toggle between a field and None
        page.screenshot(path=str(ui.shots / "ui-form.png"), full_page=True)
        page.get_by_text("Select", exact=True).first.click()
        page.get_by_role("option", name="tiny").click()
        # The server's SQLite can refuse a write that meets another (busy or locked; seen once, the form sent seconds
        # after a run ended; the server log names the error: PREFECT_SERVER_LOG_RETRYABLE_ERRORS). Prefect answers
        # 503, for "errors clients can retry on" (prefect/server/api/server.py), which its Python client retries by
        # itself. Its UI shows the error and keeps the form, and the user sends it again: so does this test, up to
        # three times.
        for _attempt in range(3):
            with page.expect_response(lambda r: r.url.endswith("/create_flow_run")) as info:
                page.get_by_role("button", name="Submit").click()
            status, body = info.value.status, info.value.text()
            if status != 503:
                break
            page.wait_for_timeout(2000)
    finally:
        page.close()
    assert status == 201, body
    return ui.finished(json.loads(body)["id"])


def test_a_passing_run_completes_named_for_its_experiment_and_run_id(ui: UI, passing: dict[str, Any]) -> None:
    run = ui.newest_run("tiny")
    assert (passing["state_type"], passing["state_name"]) == ("COMPLETED", "Completed"), ui.server.logs(passing["id"])
    assert passing["name"] == f"align-tiny-{run.id}"
    assert re.fullmatch(rf"run {run.id}: aligned, \d+ criteria pass", passing["state"]["message"])
    tasks = ui.task_runs(passing["id"])
    for step, host in (("npu_base_train", "ascend"), ("convert_bf16", "cpu"), ("gpu_train", "cuda"),
                       ("compare", "controller")):
        assert tasks[f"{step} @ {host}"]["state"]["name"] == "Completed"


def test_a_failed_verdict_ends_not_aligned_with_the_failed_criterion(ui: UI, failing: dict[str, Any]) -> None:
    run = ui.newest_run("strict")
    assert (run.status, run.verdict) == ("completed", "fail")
    assert (failing["state_type"], failing["state_name"]) == ("FAILED", "Not aligned")
    assert failing["name"] == f"align-strict-{run.id}"
    assert failing["state"]["message"].startswith(f"run {run.id}: |max_abs(grad_norm)| < 1e-30 failed: value ")
    tasks = ui.task_runs(failing["id"])
    assert tasks["gpu_train @ cuda"]["state"]["name"] == "Cached"  # the trainings are tiny's
    assert tasks["compare @ controller"]["state"]["name"] == "Completed"  # other criteria: judged again


def test_a_run_from_the_form_reuses_every_step_and_its_tasks_end_cached(ui: UI, passing: dict[str, Any],
                                                                        nightly_in_flight: str,
                                                                        from_the_form: dict[str, Any]) -> None:
    original = passing["name"].removeprefix("align-tiny-")
    run = ui.newest_run("tiny")
    assert run.id != original
    assert (from_the_form["state_type"], from_the_form["name"]) == ("COMPLETED", f"align-tiny-{run.id}")
    tasks = {name.split(" @ ")[0]: t for name, t in ui.task_runs(from_the_form["id"]).items()}
    for step in EVERY_STEP:
        state = tasks[step]["state"]
        assert (state["type"], state["name"]) == ("COMPLETED", "Cached"), step
        assert state["message"].startswith(f"reused from run {original} (step run "), state["message"]


def badge(page: Any, text: str) -> dict[str, Any]:
    """A state badge as drawn: its text, background colour (computed) and the UI's state class."""
    found = page.locator("[data-slot=badge]", has_text=text).first
    found.wait_for()
    return dict(found.evaluate("e => ({text: e.textContent.trim(), bg: getComputedStyle(e).backgroundColor, "
                               "state: (e.className.match(/bg-state-([a-z]+)-100/) || [])[1]})"))


def rgb(css: str) -> tuple[int, ...]:
    return tuple(int(v) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3])


def test_the_runs_list_tells_failed_from_aligned_runs_by_name_and_colour(
        ui: UI, page: Any, passing: dict[str, Any], failing: dict[str, Any], from_the_form: dict[str, Any]) -> None:
    page.goto(f"{ui.server.url}/v2/runs", wait_until="networkidle")
    for run in (passing, failing, from_the_form):
        page.get_by_text(run["name"], exact=True).first.wait_for()
    page.screenshot(path=str(ui.shots / "ui-runs.png"), full_page=True)
    failed, completed = badge(page, "Not aligned"), badge(page, "Completed")
    assert failed["state"] == "failed"
    assert completed["state"] == "completed"
    r, g, _ = rgb(failed["bg"])
    assert r > g  # red-ish
    r, g, _ = rgb(completed["bg"])
    assert g > r  # green-ish
    assert page.get_by_text("align-tiny", exact=True).count() == 0  # no anonymous names


def test_the_failed_run_shows_its_verdict_curves_table_and_a_report_that_opens(ui: UI, page: Any,
                                                                               failing: dict[str, Any]) -> None:
    run = ui.run(failing["name"].removeprefix("align-strict-"))  # not the newest: the nightly's is in flight
    page.goto(f"{ui.server.url}/v2/runs/flow-run/{failing['id']}", wait_until="networkidle")
    assert badge(page, "Not aligned")["state"] == "failed"
    page.get_by_role("tab", name="Artifacts").click()
    for key in ("strict-summary", "strict-metrics", "strict-report"):
        page.get_by_text(key).first.wait_for()
    page.screenshot(path=str(ui.shots / "ui-failed-run.png"), full_page=True)
    published = ui.artifacts(failing["id"])

    page.goto(f"{ui.server.url}/v2/artifacts/artifact/{published['strict-summary']['id']}", wait_until="networkidle")
    page.get_by_text("Verdict: FAIL").first.wait_for()
    page.get_by_text("|max_abs(grad_norm)| < 1e-30 failed").first.wait_for()
    plots = page.locator("img[alt=lm_loss], img[alt=grad_norm]")
    plots.first.wait_for()
    sizes = plots.evaluate_all("imgs => imgs.map(i => [i.alt, i.naturalWidth, i.getBoundingClientRect().width])")
    assert {alt for alt, _, _ in sizes} == {"lm_loss", "grad_norm"}
    assert all(natural >= 300 and shown >= 300 for _, natural, shown in sizes), sizes  # drawn, on the page
    page.screenshot(path=str(ui.shots / "ui-failed-summary.png"), full_page=True)

    page.goto(f"{ui.server.url}/v2/artifacts/artifact/{published['strict-metrics']['id']}", wait_until="networkidle")
    page.get_by_text("max |e| (step)", exact=True).first.wait_for()
    fits = page.evaluate("""() => { const t = document.querySelector('table'); const box = t.parentElement;
        const ths = [...t.querySelectorAll('th')]; const last = ths[ths.length - 1].getBoundingClientRect();
        return {columns: ths.map(h => h.textContent.trim()), scroll: box.scrollWidth - box.clientWidth,
                lastRight: last.right, boxRight: box.getBoundingClientRect().right,
                cells: [...t.querySelectorAll('td')].map(td => td.textContent.trim())}; }""")
    page.screenshot(path=str(ui.shots / "ui-failed-metrics.png"), full_page=True)
    assert fits["columns"][0] == "statistic"
    assert {"lm_loss", "grad_norm"} <= set(fits["columns"])  # named by metric: all compared over the same steps
    assert fits["scroll"] <= 1, fits  # every column in view: no sideways scrolling...
    assert fits["lastRight"] <= fits["boxRight"] + 1, fits  # ...the last column inside the box
    assert not any(len(c) > 24 for c in fits["cells"]), fits["cells"]  # no float noise

    link = published["strict-report"]["data"]
    url = link.split("](", 1)[1].rstrip(")")
    assert url.startswith(f"{ui.reports_url}/{run.id}-")
    opened = page.goto(url, wait_until="load")
    assert opened is not None
    assert opened.status == 200
    assert run.id in page.title()


def test_the_cached_run_links_the_report_it_reused_and_says_so(ui: UI, page: Any, passing: dict[str, Any],
                                                               from_the_form: dict[str, Any]) -> None:
    original = passing["name"].removeprefix("align-tiny-")
    page.goto(f"{ui.server.url}/v2/runs/flow-run/{from_the_form['id']}", wait_until="networkidle")
    page.get_by_role("tab", name="Task Runs").click()
    page.get_by_text("gpu_train @ cuda").first.wait_for()
    assert badge(page, "Cached")["state"] == "completed"
    assert page.locator("[data-slot=badge]", has_text="Cached").count() == len(EVERY_STEP)
    page.screenshot(path=str(ui.shots / "ui-cached-run.png"), full_page=True)
    published = ui.artifacts(from_the_form["id"])
    assert f"reused from run `{original}`" in published["tiny-summary"]["data"]
    link = published["tiny-report"]["data"]
    assert link.startswith(f"[tiny report (run {original}), reused by run ")
    url = link.split("](", 1)[1].rstrip(")")
    assert url.startswith(f"{ui.reports_url}/{original}-")
    assert httpx.get(url, timeout=30).status_code == 200


def test_a_regressed_nightly_names_it_and_calls_the_webhook(ui: UI, nightly_in_flight: str) -> None:
    nightly = ui.finished(nightly_in_flight)
    assert (nightly["state_type"], nightly["state_name"]) == ("FAILED", "Regressed")
    assert nightly["state"]["message"].startswith("nightly: 1 of 1 experiment(s) regressed: strict (verdict fail")
    alert = ui.hooks.received.get(timeout=120)  # the automation `serve` installed, sent by the Prefect server
    assert alert["path"] == "/hook"
    assert alert["json"]["subject"] == f"alignflow {nightly['name']}: Regressed"
    assert alert["json"]["text"].startswith(nightly["state"]["message"])
    assert nightly["id"] in alert["json"]["text"]  # with a link to the run
    assert ui.hooks.received.empty()  # once
