"""A real PostgreSQL server for the test session: `initdb` + `pg_ctl` in a temporary directory.

Listens on 127.0.0.1 at a free port and on a private socket directory; trust authentication (the server is
reachable only from this machine and lives for one test session). PostgreSQL refuses to run as root, so when
the tests run as root the server runs as the `postgres` OS user (`runuser`), which then owns its data dir.

Missing binaries fail the session loudly instead of skipping: `.ci/run` installs them (apt `postgresql`), and a
store suite that silently ran on SQLite only would prove nothing about production.

Fixtures: `postgres_server` (session) and `postgres_url` (a fresh, empty database per test).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_USER = "postgres"  # the OS user when running as root, and the database superuser in every case
BASE_PREFIX = "alignflow-pg-"


def find_bindir() -> Path:
    """The directory holding initdb/pg_ctl: `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name or 0))
    candidates += [Path(p) for p in reversed(versions)]
    for directory in candidates:
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return directory
    pytest.fail(
        "PostgreSQL server binaries (initdb, pg_ctl) not found via `pg_config --bindir` or /usr/lib/postgresql/*/bin;"
        " install them (apt-get install postgresql - `.ci/run` does) - the store tests need a real server",
        pytrace=False,
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PostgresServer:
    """A running server: where it listens and how to reach it."""

    bindir: Path
    base: Path
    port: int

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    def url(self, database: str = "postgres", *, password: str | None = None) -> str:
        auth = SERVER_USER if password is None else f"{SERVER_USER}:{password}"
        return f"postgresql+psycopg://{auth}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its URL."""
        name = name or f"t_{secrets.token_hex(6)}"
        self._admin(f'CREATE DATABASE "{name}"')  # name is ours: t_ + hex
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database even if a test left connections open (each copy of template1 costs ~8 MB of disk)."""
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=SERVER_USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # DDL with our own identifiers, not user input


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        pytest.fail(f"running as root, and PostgreSQL refuses root: create the OS user {SERVER_USER!r} "
                    "(the postgresql package does)", pytrace=False)
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.fail("running as root without `runuser` (util-linux): cannot start PostgreSQL as another user",
                    pytrace=False)
    return [runuser, "-u", SERVER_USER, "--"]


def _run(argv: list[str], what: str, log: Path | None = None) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if out.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
        pytest.fail(f"PostgreSQL lab: {what} failed (exit {out.returncode}): {' '.join(argv)}\n"
                    f"{out.stdout}\n{out.stderr}\n{tail}", pytrace=False)


def _reap_orphans(bindir: Path, prefix: list[str]) -> None:
    """Stop servers left by test sessions that were killed before their teardown (their owner pid is gone)."""
    for owner_file in Path(tempfile.gettempdir()).glob(f"{BASE_PREFIX}*/owner.pid"):
        try:
            owner = int(owner_file.read_text().strip())
            os.kill(owner, 0)
            continue  # its session is still running
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue  # not ours to judge (another user's, or being written)
        base = owner_file.parent
        subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "-w", "stop"],
                       capture_output=True, check=False, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def start_server() -> PostgresServer:
    bindir = find_bindir()
    prefix = _as_server_user()
    _reap_orphans(bindir, prefix)
    # Not under pytest's basetemp: that is mode 0700 and owned by the test user, which `postgres` cannot enter.
    base = Path(tempfile.mkdtemp(prefix=BASE_PREFIX))
    (base / "owner.pid").write_text(str(os.getpid()))
    socket_dir = base / "sock"
    socket_dir.mkdir()
    if prefix:
        pw = pwd.getpwnam(SERVER_USER)
        for path in (base, socket_dir):
            os.chown(path, pw.pw_uid, pw.pw_gid)
    _run([*prefix, str(bindir / "initdb"), "-D", str(base / "data"), "-U", SERVER_USER, "--auth=trust",
          "-E", "UTF8", "--locale=C", "--no-sync"], "initdb")
    log = base / "server.log"
    last_error = ""
    for _attempt in range(3):  # the free port can be taken between probing and binding
        port = _free_port()
        options = (f"-p {port} -k {socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
        out = subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-o", options, "-l", str(log), "-w",
             "-t", "60", "start"],
            capture_output=True, text=True, check=False, timeout=120,
        )
        if out.returncode == 0:
            return PostgresServer(bindir=bindir, base=base, port=port)
        last_error = out.stdout + out.stderr + (log.read_text(errors="replace")[-2000:] if log.exists() else "")
    shutil.rmtree(base, ignore_errors=True)
    pytest.fail(f"PostgreSQL lab: the server did not start:\n{last_error}", pytrace=False)


def stop_server(server: PostgresServer) -> None:
    prefix = _as_server_user()
    subprocess.run([*prefix, str(server.bindir / "pg_ctl"), "-D", str(server.data_dir), "-m", "fast", "-w",
                    "stop"], capture_output=True, text=True, check=False, timeout=120)
    shutil.rmtree(server.base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = start_server()
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a new, empty database on the session's server (dropped after the test)."""
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url.rsplit("/", 1)[1])
