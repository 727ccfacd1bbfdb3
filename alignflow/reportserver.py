"""The state dir's HTML reports over HTTP, read-only: what the Prefect UI's report links open (issue 19).

`alignflow serve` starts one beside its deployments unless the reports are already served elsewhere
(`ALIGNFLOW_REPORTS_URL`, e.g. the nginx service of docker/compose.yaml). It is the standard library's static file
handler with three things taken away: no directory listings, nothing outside the reports directory (a symlink
that leads out is refused), no method but GET and HEAD (the handler has no other). Each request is logged at
debug level, not printed.

One thing added: `/` is an index of the reports (issue 40: it was a 404), newest first - run id, experiment,
verdict, time, each linking to its report; `/?experiment=NAME` keeps one experiment's. It is made at each request
from each report directory's `meta.json` (alignflow.compare.report), so it lists what is there now, without the
store; a report written before meta.json existed is listed from its directory name and comparison.json.

Where the reports are served is told to the runs that link them (`reports_url`): `$ALIGNFLOW_REPORTS_URL` when
set, else the address `serve` publishes in the state dir (`<state>/reports-url`, removed when it stops), so an
`alignflow run` on the controller links over http too while `serve` is up.
"""

from __future__ import annotations

import html
import io
import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

log = logging.getLogger(__name__)

REPORTS_URL_ENV = "ALIGNFLOW_REPORTS_URL"
PUBLISHED_NAME = "reports-url"


def reports_dir(state_dir: Path) -> Path:
    return state_dir / "reports"


def reports_url(state_dir: Path, environ: Mapping[str, str] | None = None) -> str | None:
    """The base URL under which `<state>/reports/` is served, or None when nothing serves it."""
    env = os.environ if environ is None else environ
    if env.get(REPORTS_URL_ENV):
        return env[REPORTS_URL_ENV]
    published = state_dir / PUBLISHED_NAME
    try:
        text = published.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def publish_url(state_dir: Path, url: str) -> None:
    """Tell runs of this state dir where its reports are served (atomic: a reader never sees half a URL)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / f".{PUBLISHED_NAME}.{os.getpid()}"
    tmp.write_text(url + "\n", encoding="utf-8")
    tmp.replace(state_dir / PUBLISHED_NAME)


def withdraw_url(state_dir: Path, url: str) -> None:
    """Remove the published address if it is still `url` (another `serve` may have published its own since)."""
    published = state_dir / PUBLISHED_NAME
    try:
        if published.read_text(encoding="utf-8").strip() == url:
            published.unlink()
    except OSError:
        pass


REPORT_PAGE, META, COMPARISON = "report.html", "meta.json", "comparison.json"  # alignflow.compare.report's names


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One report as the index lists it."""

    folder: str  # the report's directory under the served root
    run_id: str
    experiment: str
    verdict: str
    generated: datetime
    title: str


def index_rows(root: Path) -> list[IndexRow]:
    """Every report directory under `root` (one holding report.html), newest first."""
    rows = []
    for folder in root.iterdir():
        page = folder / REPORT_PAGE
        if folder.is_symlink() or not page.is_file() or not page.resolve().is_relative_to(root):
            continue
        meta = _json(folder / META)
        verdict = meta.get("verdict") or _json(folder / COMPARISON).get("verdict") or "?"
        try:
            generated = datetime.fromisoformat(str(meta["generated_at"]))
        except (KeyError, TypeError, ValueError):
            generated = datetime.fromtimestamp(page.stat().st_mtime, UTC)
        if generated.tzinfo is None:
            generated = generated.replace(tzinfo=UTC)
        rows.append(IndexRow(folder.name, str(meta.get("run_id") or folder.name.split("-", 1)[0]),
                             str(meta.get("experiment") or ""), str(verdict), generated,
                             str(meta.get("title") or "")))
    return sorted(rows, key=lambda r: (r.generated, r.folder), reverse=True)


def _json(path: Path) -> dict[str, Any]:
    """A small JSON file of a report, {} when missing or unreadable (a report being written, an old one)."""
    try:
        with path.open(encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


INDEX_STYLE = """body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:1rem 1.2rem;color:#1c2833}
h1{font-size:1.3rem}table{border-collapse:collapse;font-size:.9rem;width:100%}
th,td{border:1px solid #d5d8dc;padding:.3rem .5rem;text-align:left}th{background:#f4f6f7}
td.pass{color:#1e8449;font-weight:700}td.fail{color:#c0392b;font-weight:700}.meta{color:#566573;font-size:.85rem}
td.run{font-family:ui-monospace,monospace}"""


def index_page(root: Path, experiment: str | None = None) -> str:
    """The HTML index of the reports under `root` (only `experiment`'s, when given)."""
    rows = [r for r in index_rows(root) if experiment is None or r.experiment == experiment]
    esc = html.escape
    body = "".join(
        f'<tr><td class="run"><a href="{esc(quote(r.folder))}/{REPORT_PAGE}">{esc(r.run_id)}</a></td>'
        f"<td>{_experiment_link(r.experiment)}</td><td class=\"{esc(r.verdict.lower())}\">{esc(r.verdict.upper())}"
        f"</td><td>{r.generated.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}</td><td>{esc(r.title)}</td></tr>\n"
        for r in rows)
    scope = f" of experiment {esc(experiment)} (<a href=\"/\">all</a>)" if experiment else ""
    empty = "" if rows else "<p>No report yet: a run writes its report when its compare step runs.</p>"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>alignflow reports</title>'
            f"<style>{INDEX_STYLE}</style></head><body><h1>alignflow reports{scope}</h1>"
            f'<p class="meta">{len(rows)} report(s), newest first</p>{empty}'
            f'<table id="reports"><thead><tr><th>run</th><th>experiment</th><th>verdict</th><th>generated</th>'
            f"<th>title</th></tr></thead><tbody>\n{body}</tbody></table></body></html>\n")


def _experiment_link(name: str) -> str:
    return f'<a href="/?experiment={html.escape(quote(name))}">{html.escape(name)}</a>' if name else ""


class _ReadOnlyFiles(SimpleHTTPRequestHandler):
    root: Path

    def __init__(self, *args: Any, root: Path, **kwargs: Any) -> None:
        self.root = root
        super().__init__(*args, directory=str(root), **kwargs)

    def send_head(self) -> Any:
        url = urlsplit(self.path)
        if url.path == "/":
            return self._index(parse_qs(url.query).get("experiment", [None])[0])
        target = Path(self.translate_path(self.path))
        try:
            inside = target.resolve().is_relative_to(self.root)
        except OSError:
            inside = False
        if not inside or target.is_dir():
            self.send_error(HTTPStatus.NOT_FOUND, "Not found")
            return None
        return super().send_head()

    def _index(self, experiment: str | None) -> io.BytesIO:
        data = index_page(self.root, experiment).encode("utf-8")
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")  # it lists what is there now
        self.end_headers()
        return io.BytesIO(data)

    def list_directory(self, path: Any) -> Any:
        self.send_error(HTTPStatus.NOT_FOUND, "Not found")
        return None

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("reports %s: " + format, self.address_string(), *args)


class ReportServer:
    """`directory` served read-only at `http://host:port/` in a daemon thread (`port=0`: any free port)."""

    def __init__(self, directory: Path, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        handler = partial(_ReadOnlyFiles, root=self.directory)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            from alignflow.errors import ConfigError

            raise ConfigError(f"reports server: cannot listen on {host}:{port}: {exc.strerror or exc}; "
                              "choose another --reports-port") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="alignflow-reports", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    def start(self) -> ReportServer:
        self._thread.start()
        log.info("serving %s read-only on http://%s:%d/", self.directory, self.host, self.port)
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> ReportServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
