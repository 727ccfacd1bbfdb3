"""The read-only reports server of `alignflow serve` (alignflow.reportserver): files over http, nothing else."""

from __future__ import annotations

import os
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
    assert httpx.get(f"{base}/", timeout=10).status_code == 404
    assert httpx.get(f"{base}/0123456789ab-c0ffee/", timeout=10).status_code == 404
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
