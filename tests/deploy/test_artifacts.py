"""What the Prefect artifacts of a run and of a nightly say (pure renderers, no Prefect server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.artifacts import (
    artifact_key,
    metric_rows,
    nightly_markdown,
    nightly_message,
    nightly_rows,
    report_link,
    run_markdown,
)

SHA = {name: (c * 64) for name, c in (("data", "d"), ("base", "a"), ("bf16", "b"), ("mg", "e"), ("log", "f"))}


def step(name: str, status: str, artifacts: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    return {"step": name, "host": "cpu", "status": status, "started": "2026-01-01T00:00:00+00:00",
            "finished": "2026-01-01T00:00:12.5+00:00",
            "artifacts": [{"name": n, "host": "cpu", "path": f"/w/{n}", "sha256": SHA[k], "size": 3 * 2**20}
                          for n, k in artifacts]}


RECORD = {
    "run_id": "0123456789ab", "experiment": "Demo MoE", "parent": None, "status": "completed", "verdict": "pass",
    "report": "/state/reports/0123456789ab-c0ffee/report.html", "error": None,
    "steps": [step("npu_base_train", "cached", (("base_ckpt", "base"),)),
              step("convert_bf16", "cached", (("bf16_ckpt", "bf16"),)),
              step("convert_megatron", "ran", (("megatron_ckpt", "mg"),)),
              step("gpu_train", "ran", (("gpu_log", "log"),))],
}
COMPARISON = {"verdict": "pass", "criteria": [
    {"metric": "lm_loss", "statistic": "me", "value": 1.25e-7, "threshold": 0.001, "passed": True,
     "label": "|me(lm_loss)| < 0.001"},
    {"metric": "grad_norm", "statistic": "me", "value": None, "threshold": 0.01, "passed": False,
     "label": "|me(grad_norm)| < 0.01"}],
    "summary": {"metrics": {"lm_loss": {"n": 30, "me": 1e-7, "max_abs": 3e-7, "step_rel": {"1": 0.0},
                                        "resolution_text": "1e-6"}}}}


def test_run_summary_has_verdict_criteria_steps_and_every_fingerprint() -> None:
    data = {"path": "/data/demo.tokens", "sha256": SHA["data"], "size": 524288}
    md = run_markdown(RECORD, COMPARISON, data=data, trigger="deployment", report_url="http://r/x/report.html")
    assert md.startswith("# Demo MoE — run `0123456789ab`")
    assert "**Verdict: PASS** · status completed · trigger deployment" in md
    assert "| \\|me(lm_loss)\\| < 0.001 | 1.25e-07 | 0.001 | pass |" in md  # pipes escaped inside the table
    assert "| \\|me(grad_norm)\\| < 0.01 | n/a | 0.01 | **FAIL** |" in md
    assert "## Steps (2 cached, 2 ran)" in md
    assert "| convert_megatron | cpu | ran | 12.5 s | megatron_ckpt `eeeeeeeeeeee` |" in md
    for what, sha in (("data", SHA["data"]), ("NPU base checkpoint", SHA["base"]), ("bf16 checkpoint", SHA["bf16"]),
                      ("Megatron checkpoint", SHA["mg"])):
        assert f"| {what} | `{sha}` | " in md  # full digests, not prefixes
    assert f"| data | `{SHA['data']}` | 512.0 KiB | `/data/demo.tokens` |" in md
    assert f"| Megatron checkpoint | `{SHA['mg']}` | 3.0 MiB | `cpu:/w/megatron_ckpt` |" in md
    assert md.endswith("Report: [report.html](http://r/x/report.html)")


def test_failed_run_summary_quotes_the_error() -> None:
    failed = {**RECORD, "status": "failed", "verdict": "fail", "report": None,
              "error": "gpu_train: load_return: missing keys\nsecond line"}
    md = run_markdown(failed, None)
    assert "**Verdict: FAIL** · status failed" in md
    assert "> gpu_train: load_return: missing keys\n> second line" in md
    assert "Report:" not in md
    assert "## Criteria" not in md


def test_metric_table_has_one_row_per_metric_without_nested_values() -> None:
    assert metric_rows(COMPARISON) == [{"metric": "lm_loss", "n": 30, "me": 1e-7, "max_abs": 3e-7,
                                        "resolution_text": "1e-6"}]


def test_keys_and_links() -> None:
    assert artifact_key("Demo MoE", "summary") == "demo-moe-summary"
    assert artifact_key("qwen3.5_moe/bf16", "report") == "qwen3-5-moe-bf16-report"
    assert artifact_key("***", "x") == "experiment-x"
    report = RECORD["report"]
    assert report_link(report, reports_url="http://team:8080/") == "http://team:8080/0123456789ab-c0ffee/report.html"
    assert report_link(report) == Path(report).resolve().as_uri()
    assert report_link("/elsewhere/report.html", reports_url="http://team:8080") == "file:///elsewhere/report.html"


CHECKS = [
    {"experiment": "demo", "run_id": "aaaa00000001", "baseline_run_id": "aaaa00000000", "status": "completed",
     "verdict": "pass", "regressed": False, "reasons": [], "config_changed": False,
     "changes": [{"key": "me(lm_loss)", "label": "|me(lm_loss)| < 0.001", "baseline": 1e-7, "value": 1e-7,
                  "change": 0.0, "allowed": 1e-4, "regression": None}]},
    {"experiment": "drifting", "run_id": "bbbb00000002", "baseline_run_id": "bbbb00000001", "status": "completed",
     "verdict": "fail", "regressed": True, "config_changed": True,
     "reasons": ["verdict fail (last passing run bbbb00000001)",
                 "|me(lm_loss)| < 0.001: grew by 0.02 (allowed 0.0001)"],
     "changes": [{"key": "me(lm_loss)", "label": "|me(lm_loss)| < 0.001", "baseline": 1e-7, "value": 0.02,
                  "change": 0.02, "allowed": 1e-4, "regression": "grew by 0.02 (allowed 0.0001)"}]},
    {"experiment": "broken", "run_id": None, "baseline_run_id": None, "status": "not started", "verdict": None,
     "regressed": True, "reasons": ["not started: broken.yaml:3: model: field required"], "changes": []},
]


def test_nightly_message_names_each_regressed_experiment_and_why() -> None:
    message = nightly_message(CHECKS)
    assert message.startswith("nightly: 2 of 3 experiment(s) regressed: drifting (verdict fail")
    assert "broken (not started: broken.yaml:3" in message
    assert "demo" not in message
    assert nightly_message(CHECKS[:1]) == "nightly: no regression in 1 experiment(s)"


def test_nightly_markdown_and_table() -> None:
    md = nightly_markdown(CHECKS)
    assert md.startswith("# Nightly regression check — 2 of 3 experiment(s) regressed")
    assert "| demo | `aaaa00000001` | pass | `aaaa00000000` | ok |" in md
    drifting = next(line for line in md.splitlines() if line.startswith("| drifting |"))
    assert "**REGRESSED**: verdict fail" in drifting
    assert "(experiment changed since the baseline)" in drifting
    assert "| broken | — | not started | none | **REGRESSED**: not started:" in md
    assert "## drifting" in md
    assert "## demo" not in md
    rows = nightly_rows(CHECKS)
    assert [(r["experiment"], r["criterion"], r["regressed"]) for r in rows] == [
        ("demo", "|me(lm_loss)| < 0.001", False), ("drifting", "|me(lm_loss)| < 0.001", True),
        ("broken", None, True)]
    assert rows[1]["last_pass"] == 1e-7
    assert rows[1]["now"] == 0.02
