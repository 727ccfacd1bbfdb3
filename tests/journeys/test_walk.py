"""The README's walk, as a new user takes it (issue 40): the commands its marked blocks show, run as written
(the `form` block is on docs/guide/prefect-and-team-server.md, the `any-trainer` block on docs/guide/any-trainer.md).

In file order, on one checkout and one state dir (tests/journeys/conftest.py):

1. `make demo`'s commands (the Makefile's `demo` recipe, without the venv set-up) - the README's sample of what
   `run` prints is checked against what it printed;
2. the `walk` block: `alignflow server start` (its UI link, opened in Chromium, lists the run), `alignflow run`
   (on the kept server: its `ui:` link shows the run, its task runs and artifacts), `alignflow ui RUN` (the first
   run's page), `alignflow diagnose RUN` (no divergent module), `alignflow export RUN --tensorboard DIR`;
3. the `form` block: `alignflow serve`, then the launch form in Chromium, submitted as it opens (the demo is
   pre-selected); the run completes, the link `serve` logs opens it, its report opens over http;
4. the `any-trainer` block: `alignflow render` prints each demo's pipeline derived from its checkpoint formats
   (Megatron against Megatron: no conversion; a Hugging Face base: a conversion per side, no base training), and
   `alignflow run` runs both to a PASS with exactly those steps;
5. nothing was written outside the checkout: the home directory is still empty.

Screenshots: `$ALIGNFLOW_SCREENSHOTS` when set, else the module's temporary directory; each is taken of a page the
test has just checked (the run's name and state, never "Unable to connect").
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.journeys.conftest import Background, Walk, printed_url, wait_for
from tests.journeys.markdown import sample_matches
from tests.journeys.test_guides import BLOCKS as GUIDE_BLOCKS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BLOCKS = {"make-demo": "output", "walk": "commands", "form": "commands", "any-trainer": "commands"}
STEPS = ("npu_base_train", "convert_bf16", "convert_megatron", "gpu_train", "npu_reload_train", "compare")
RUN_LINE = re.compile(r"^run ([0-9a-f]{12}) of demo: completed, verdict PASS", re.M)


def makefile_recipe(makefile: Path, target: str) -> list[str]:
    """The commands of a Makefile target's recipe, the venv's `$(BIN)/` left to the PATH (as after `make venv`)."""
    lines = makefile.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().replace("$(BIN)/", ""))
    return recipe


def badge(page: Any, text: str) -> str:
    """The UI's state class of the first state badge reading `text`."""
    found = page.locator("[data-slot=badge]", has_text=text).first
    found.wait_for()
    return str(found.evaluate("e => (e.className.match(/bg-state-([a-z]+)-100/) || [])[1] || ''"))


def connected(page: Any) -> None:
    body = page.inner_text("body")
    assert "Unable to connect" not in body, body[:500]


def test_the_docs_mark_the_blocks_this_journey_walks(walk: Walk) -> None:
    """A block marked and never walked, or a walked block no longer marked, fails here (tests/journeys/markdown.py):
    the docs' marked blocks are this walk's and the guides' cheap ones (test_guides.py), nothing else."""
    assert {name: block.kind for name, block in walk.blocks.items()} == BLOCKS | GUIDE_BLOCKS
    assert walk.blocks["walk"].placeholders == ("RUN",)


def test_make_demo_runs_the_demo_and_prints_what_the_readme_shows(walk: Walk) -> None:
    commands = makefile_recipe(walk.repo / "Makefile", "demo")
    assert commands == ["alignflow doctor", "alignflow run experiments/demo.yaml"]
    doctor = walk.sh(commands[0])
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    run = walk.sh(commands[1])
    assert run.returncode == 0, run.stdout + run.stderr
    found = RUN_LINE.search(run.stdout)
    assert found, run.stdout
    walk.values["RUN"] = found.group(1)
    assert sample_matches(walk.block("make-demo"), run.stdout) == []
    # its Prefect server was started for it and is gone: the way to its page is `alignflow ui`
    assert f"ui:      `alignflow ui {found.group(1)}` opens it" in run.stdout
    assert "anonymous usage" not in run.stdout + run.stderr


def test_the_kept_servers_ui_link_lists_the_run_completed(walk: Walk, page: Any) -> None:
    done = walk.run("walk", 0, "alignflow server start", timeout_s=600)
    assert done.returncode == 0, done.stdout + done.stderr
    page.goto(printed_url(done.stdout, "UI"), wait_until="networkidle")
    name = f"align-demo-{walk.values['RUN']}"
    page.get_by_text(name, exact=True).first.wait_for()
    connected(page)
    assert badge(page, "Completed") == "completed"
    page.screenshot(path=str(walk.shots / "journey-1-server-start-runs.png"), full_page=True)


def test_a_run_on_the_kept_server_prints_the_page_of_its_run(walk: Walk, page: Any) -> None:
    done = walk.run("walk", 1, "alignflow run experiments/demo.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    found = RUN_LINE.search(done.stdout)
    assert found, done.stdout
    for step in STEPS[:-1]:  # every training and conversion reused; the display said so, one line each
        assert re.search(rf"^{step} +cached +from run ", done.stderr, re.M), done.stderr
    page.goto(printed_url(done.stdout, "ui:"), wait_until="networkidle")
    page.get_by_text(f"align-demo-{found.group(1)}", exact=True).first.wait_for()
    connected(page)
    assert badge(page, "Completed") == "completed"
    page.get_by_role("tab", name="Task Runs").click()
    for step in STEPS:
        page.get_by_text(re.compile(rf"^{step} @ ")).first.wait_for()
    assert page.locator("[data-slot=badge]", has_text="Cached").count() >= len(STEPS) - 1
    page.screenshot(path=str(walk.shots / "journey-2-run-task-runs.png"), full_page=True)
    page.get_by_role("tab", name="Artifacts").click()
    for key in ("demo-summary", "demo-metrics", "demo-report"):
        page.get_by_text(key).first.wait_for()
    page.screenshot(path=str(walk.shots / "journey-3-run-artifacts.png"), full_page=True)


def test_alignflow_ui_prints_the_page_of_a_run_made_before_the_server_was_kept(walk: Walk, page: Any) -> None:
    done = walk.run("walk", 2, "alignflow ui")
    assert done.returncode == 0, done.stdout + done.stderr
    url = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v2/runs/flow-run/[0-9a-f-]{36}", url), done.stdout
    page.goto(url, wait_until="networkidle")
    page.get_by_text(f"align-demo-{walk.values['RUN']}", exact=True).first.wait_for()
    connected(page)
    assert badge(page, "Completed") == "completed"
    page.get_by_role("tab", name="Artifacts").click()
    page.get_by_text("demo-report").first.wait_for()
    page.screenshot(path=str(walk.shots / "journey-4-ui-first-run.png"), full_page=True)


def test_diagnose_finds_no_divergent_module_in_the_demo(walk: Walk) -> None:
    done = walk.run("walk", 3, "alignflow diagnose")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: no divergent module" in done.stdout
    # issue 47: not step 1, whose warm-up lr of 0 hides the optimizer
    assert "diagnose: step 2, the first step where the optimizer acts" in done.stderr


def test_export_writes_both_sides_curves_for_tensorboard(walk: Walk) -> None:
    command = walk.command("walk", 4, "alignflow export")
    args = shlex.split(command.split("#")[0])
    directory = walk.work / args[args.index("--tensorboard") + 1]
    done = walk.sh(command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(directory.rglob("events.out.tfevents*")), done.stdout


def test_the_form_launches_a_run_that_completes_and_its_report_opens_over_http(walk: Walk, page: Any) -> None:
    serve = walk.start("form", 0, "alignflow serve")
    shown = wait_for("`alignflow serve` to print its reports URL",
                     lambda: re.search(r"^reports: +(http://\S+)/$", serve.output(), re.M), timeout_s=300, proc=serve)
    reports = shown.group(1)
    prefect = re.search(r"^prefect: +(http://\S+) — UI (http://\S+)/deployments$", serve.output(), re.M)
    assert prefect, serve.output()
    with httpx.Client(base_url=prefect.group(1), timeout=30) as api:
        _launch_from_the_form(walk, page, serve, api, prefect.group(2), reports)
    assert serve.interrupt() == 0, serve.output()[-3000:]  # Ctrl-C ends it
    assert "stopped" in serve.output()


def _launch_from_the_form(walk: Walk, page: Any, serve: Background, api: httpx.Client, ui: str, reports: str) -> None:
    deployment = wait_for("the launch deployment", lambda: (r := api.get("/deployments/name/alignment/launch"))
                          .status_code == 200 and r.json(), timeout_s=300, proc=serve)
    page.goto(f"{ui}/deployments/deployment/{deployment['id']}/run", wait_until="networkidle")
    page.get_by_text("Experiment", exact=False).first.wait_for()
    connected(page)
    labels = page.evaluate("() => [...document.querySelectorAll('[aria-label^=Select]')].map(e => e.ariaLabel)")
    assert len(labels) == len(set(labels)), labels  # no two fields labelled alike ("Select StepName" twice)
    assert page.get_by_role("button", name="Select Experiment").inner_text().strip() == "demo"  # pre-selected
    page.screenshot(path=str(walk.shots / "journey-5-form.png"), full_page=True)
    status, body = 0, ""
    for _attempt in range(3):  # SQLite busy: Prefect answers 503, its UI keeps the form and the user sends it again
        with page.expect_response(lambda r: r.url.endswith("/create_flow_run")) as info:
            page.get_by_role("button", name="Submit").click()
        status, body = info.value.status, info.value.text()
        if status != 503:
            break
        page.wait_for_timeout(2000)
    assert status == 201, body
    flow_run_id = json.loads(body)["id"]
    final = wait_for("the launched run to end", lambda: (r := api.get(f"/flow_runs/{flow_run_id}").json())
                     ["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") and r,
                     timeout_s=900, every_s=0.5, proc=serve)
    assert (final["state_type"], final["state_name"]) == ("COMPLETED", "Completed"), final["state"]
    assert re.fullmatch(r"align-demo-[0-9a-f]{12}", final["name"])

    view_at = wait_for("serve's link to the run", lambda: re.search(
        rf"View at (http://\S+/{flow_run_id})", serve.output()), timeout_s=60)
    page.goto(view_at.group(1), wait_until="networkidle")
    page.get_by_text(final["name"], exact=True).first.wait_for()
    connected(page)
    assert badge(page, "Completed") == "completed"
    page.screenshot(path=str(walk.shots / "journey-6-form-run.png"), full_page=True)

    artifacts = api.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}).json()
    link = next(a["data"] for a in artifacts if a["key"] == "demo-report")
    url = link.split("](", 1)[1].rstrip(")")
    assert url.startswith(f"{reports}/"), link
    opened = page.goto(url, wait_until="load")
    assert opened is not None
    assert opened.status == 200
    assert re.search(r"[0-9a-f]{12}", page.title()), page.title()
    page.screenshot(path=str(walk.shots / "journey-7-report.png"), full_page=True)


def _steps_ran(output: str) -> list[str]:
    """The steps of the summary table `run` printed (first column), in its order."""
    return re.findall(r"^│ ([a-z0-9_]+) +│ ran ", output, re.M)


def test_the_pipelines_follow_the_checkpoint_formats_and_both_demos_pass(walk: Walk) -> None:
    same = walk.run("any-trainer", 0, "alignflow render demo-same-format")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "convert_" not in same.stdout, same.stdout
    assert re.search(r"^npu_base_train ", same.stdout, re.M), same.stdout
    hf = walk.run("any-trainer", 1, "alignflow render demo-hf-base")
    assert hf.returncode == 0, hf.stdout + hf.stderr
    assert re.search(r"^convert_mindformers ", hf.stdout, re.M), hf.stdout
    assert re.search(r"^convert_megatron ", hf.stdout, re.M), hf.stdout
    assert "npu_base_train" not in hf.stdout, hf.stdout
    for index, name, steps in (
            (2, "demo-same-format", ["npu_base_train", "gpu_train", "npu_reload_train", "compare"]),
            (3, "demo-hf-base", ["convert_mindformers", "convert_megatron", "gpu_train", "npu_reload_train",
                                 "compare"])):
        done = walk.run("any-trainer", index, f"alignflow run experiments/{name}.yaml")
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(rf"^run [0-9a-f]{{12}} of {name}: completed, verdict PASS", done.stdout, re.M), done.stdout
        assert _steps_ran(done.stdout) == steps, done.stdout


def test_nothing_was_written_outside_the_checkout(walk: Walk) -> None:
    assert sorted(p.name for p in walk.home.iterdir()) == []  # no ~/.prefect, ~/.cache, ~/.config
    export_dir = shlex.split(walk.command("walk", 4, "alignflow export").split("#")[0])
    made = {".alignflow", export_dir[export_dir.index("--tensorboard") + 1]}
    assert {p.name for p in walk.work.iterdir()} == {"experiments", "hosts.yaml", *made}
