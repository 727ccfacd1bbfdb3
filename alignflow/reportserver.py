"""The state dir's HTML reports over HTTP, read-only: what the Prefect UI's report links open (issue 19).

`alignflow serve` starts one beside its deployments unless the reports are already served elsewhere
(`ALIGNFLOW_REPORTS_URL`, e.g. the nginx service of docker/compose.yaml). It is the standard library's static file
handler with three things taken away: no directory listings, nothing outside the reports directory (a symlink
that leads out is refused), no method but GET and HEAD (the handler has no other). Each request is logged at
debug level, not printed.

Where the reports are served is told to the runs that link them (`reports_url`): `$ALIGNFLOW_REPORTS_URL` when
set, else the address `serve` publishes in the state dir (`<state>/reports-url`, removed when it stops), so an
`alignflow run` on the controller links over http too while `serve` is up.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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


class _ReadOnlyFiles(SimpleHTTPRequestHandler):
    root: Path

    def __init__(self, *args: Any, root: Path, **kwargs: Any) -> None:
        self.root = root
        super().__init__(*args, directory=str(root), **kwargs)

    def send_head(self) -> Any:
        target = Path(self.translate_path(self.path))
        try:
            inside = target.resolve().is_relative_to(self.root)
        except OSError:
            inside = False
        if not inside or target.is_dir():
            self.send_error(HTTPStatus.NOT_FOUND, "Not found")
            return None
        return super().send_head()

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
