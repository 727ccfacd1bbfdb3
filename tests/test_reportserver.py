"""The read-only reports server of `alignflow serve` (alignflow.reportserver): files over http, nothing else."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from alignflow.reportserver import ReportServer, publish_url, reports_url, withdraw_url


@pytest.fixture
def served(tmp_path: Path) -> tuple[ReportServer, Path]:
    reports = tmp_path / "state" / "reports"
    (reports / "0123456789ab-c0ffee").mkdir(parents=True)
    (reports / "0123456789ab-c0ffee" / "report.html").write_text("<html>the report</html>")
    (tmp_path / "secret.txt").write_text("not a report")
    (reports / "escape.txt").symlink_to(tmp_path / "secret.txt")
    server = ReportServer(reports).start()
    yield server, reports
    server.close()


def test_a_report_is_served_with_its_type(served: tuple[ReportServer, Path]) -> None:
    server, _ = served
    page = httpx.get(f"http://127.0.0.1:{server.port}/0123456789ab-c0ffee/report.html", timeout=10)
    assert page.status_code == 200
    assert page.text == "<html>the report</html>"
    assert page.headers["content-type"].startswith("text/html")


def test_no_listing_no_escape_no_writes(served: tuple[ReportServer, Path]) -> None:
    server, reports = served
    base = f"http://127.0.0.1:{server.port}"
    assert httpx.get(f"{base}/0123456789ab-c0ffee/", timeout=10).status_code == 404  # `/` is the index, no listing
    assert httpx.get(f"{base}/escape.txt", timeout=10).status_code == 404  # a symlink out of the reports dir
    assert httpx.get(f"{base}/../secret.txt", timeout=10).status_code == 404
    for method in ("PUT", "POST", "DELETE"):
        assert httpx.request(method, f"{base}/0123456789ab-c0ffee/report.html", content=b"x",
                             timeout=10).status_code == 501
    assert (reports / "0123456789ab-c0ffee" / "report.html").read_text() == "<html>the report</html>"


def test_the_published_address_is_what_runs_link_unless_the_environment_names_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert reports_url(state, {}) is None
    publish_url(state, "http://controller:4201")
    assert reports_url(state, {}) == "http://controller:4201"
    assert reports_url(state, {"ALIGNFLOW_REPORTS_URL": "http://nginx/reports"}) == "http://nginx/reports"
    withdraw_url(state, "http://other:1")  # another serve's address: left alone
    assert reports_url(state, {}) == "http://controller:4201"
    withdraw_url(state, "http://controller:4201")
    assert reports_url(state, {}) is None
    assert not [p for p in os.listdir(state) if p.startswith(".")]  # no temporary file left behind


def test_a_port_in_use_is_a_clear_error(served: tuple[ReportServer, Path]) -> None:
    from alignflow.errors import ConfigError

    server, reports = served
    with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{server.port}.*--reports-port"):
        ReportServer(reports, port=server.port)


def test_the_root_is_an_index_of_the_reports_newest_first_linking_each(tmp_path: Path) -> None:
    """Issue 40: `/` was a 404. Three reports as the compare step writes them, one of them written before
    meta.json existed (listed from its directory name and comparison.json)."""
    from datetime import UTC, datetime

    from alignflow.compare.comparison import compare
    from alignflow.compare.context import ReportContext
    from alignflow.compare.report import write_report
    from alignflow.config.criteria import default_criteria
    from alignflow.logs import parse_log
    from tests.logfixtures import make_run, megatron_lines, mindformers_lines, perturbed

    reports = tmp_path / "state" / "reports"
    ref = make_run(20, seed=1)
    good = compare(parse_log(mindformers_lines(perturbed(ref, loss_noise=1e-6, seed=2)), source="npu"),
                   parse_log(megatron_lines(ref), source="gpu"), default_criteria())
    bad = compare(parse_log(mindformers_lines(perturbed(ref, loss_offset=0.01, seed=3)), source="npu"),
                  parse_log(megatron_lines(ref), source="gpu"), default_criteria())
    for run_id, experiment, result, hour in (("aaaaaaaaaaaa", "demo", good, 9), ("bbbbbbbbbbbb", "glm<mini>", bad, 11)):
        ctx = ReportContext(run_id=run_id, experiment=experiment, generated_at=datetime(2026, 3, 1, hour, tzinfo=UTC))
        write_report(result, reports / f"{run_id}-0a1b2c", title=f"{experiment} — run {run_id}",
                     labels=("NPU", "GPU"), context=ctx, plots=False)
    old = write_report(good, reports / "cccccccccccc-d00d00", labels=("NPU", "GPU"), plots=False)
    assert old.meta is not None
    old.meta.unlink()
    os.utime(old.html, (datetime(2026, 3, 1, 10, tzinfo=UTC).timestamp(),) * 2)
    (reports / "not-a-report").mkdir()
    with ReportServer(reports) as server:
        base = f"http://127.0.0.1:{server.port}"
        page = httpx.get(f"{base}/", timeout=10)
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        rows = re.findall(r'<tr><td class="run"><a href="([^"]+)">([^<]+)</a></td><td>(.*?)</td>'
                          r'<td class="[a-z?]+">([A-Z?]+)</td><td>([^<]+)</td>', page.text)
        assert [(r[1], r[3], r[4]) for r in rows] == [
            ("bbbbbbbbbbbb", "FAIL", "2026-03-01 11:00:00 UTC"),
            ("cccccccccccc", "PASS", "2026-03-01 10:00:00 UTC"),
            ("aaaaaaaaaaaa", "PASS", "2026-03-01 09:00:00 UTC")]
        assert "glm&lt;mini&gt;" in rows[0][2]  # escaped
        assert "<mini>" not in page.text
        for href, *_ in rows:  # every link opens its report
            assert httpx.get(f"{base}/{href}", timeout=10).text.startswith("<!DOCTYPE html>")
        demo = httpx.get(f"{base}/", params={"experiment": "demo"}, timeout=10).text
        assert "aaaaaaaaaaaa" in demo
        assert "bbbbbbbbbbbb" not in demo
        assert httpx.head(f"{base}/", timeout=10).status_code == 200
