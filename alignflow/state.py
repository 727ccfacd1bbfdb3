"""Where alignflow keeps its local state: the state directory and the store's database URL.

Resolved when called, never at import (a test or a flow may set the environment first):

- state dir: `$ALIGNFLOW_STATE_DIR`, else `./.alignflow` (relative to the working directory of the call);
- database: `$ALIGNFLOW_DB_URL` (e.g. `postgresql+psycopg://alignflow@db.example/alignflow`), else SQLite at
  `<state dir>/store.sqlite`.

The state dir holds everything alignflow writes on this machine: the store, reports, fetched logs, the owned
Prefect server (`prefect/`), the workdirs of local hosts whose workdir is relative (`hosts/<name>` in the
committed hosts.yaml) and data that an experiment places there with `{state_dir}/...` (the demo's tokens).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from alignflow.errors import ConfigError

STATE_DIR_ENV = "ALIGNFLOW_STATE_DIR"
DB_URL_ENV = "ALIGNFLOW_DB_URL"
DEFAULT_STATE_DIR = ".alignflow"
STORE_FILENAME = "store.sqlite"
# A path in an experiment file that starts with this lives under the state dir (`{state_dir}/data/demo.tokens`).
STATE_DIR_TOKEN = "{state_dir}"


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The state directory (absolute; not created here)."""
    env = os.environ if environ is None else environ
    raw = env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    return Path(raw).expanduser().resolve()


def sqlite_url(directory: Path) -> str:
    """The SQLAlchemy URL of the SQLite store inside `directory`."""
    return f"sqlite:///{(directory / STORE_FILENAME).expanduser().resolve()}"


def database_url(state: Path | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The store's URL: `$ALIGNFLOW_DB_URL` if set, else SQLite in `state` (default: `state_dir()`).

    The environment wins over `state` on purpose: a flow passes its state dir for reports and job files, while a
    deployment points every process at one PostgreSQL database through the environment.
    """
    env = os.environ if environ is None else environ
    url = env.get(DB_URL_ENV)
    if url:
        return url
    return sqlite_url(state if state is not None else state_dir(env))


def expand_state_dir(path: str, state: Path | None = None) -> str:
    """`path` with a leading `{state_dir}` replaced by the state dir (default: `state_dir()`); else unchanged."""
    if path != STATE_DIR_TOKEN and not path.startswith(STATE_DIR_TOKEN + "/"):
        return path
    return str((state if state is not None else state_dir()) / path[len(STATE_DIR_TOKEN):].lstrip("/"))


def writable_dir(path: Path, *, fix: str | None = None) -> Path:
    """`path` (the state dir or a directory in it), created if missing and checked writable; a `ConfigError` (exit 2)
    naming the directory that refuses, instead of an `OSError` traceback from whichever write came first (issue
    33: a read-only state dir). `fix`: what the user does about it, when `path` is not under the state dir."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(_unwritable(path, exc.strerror or str(exc), fix)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(_unwritable(path, "not writable", fix))
    return path


def _unwritable(path: Path, why: str, fix: str | None) -> str:
    refusing = next((p for p in (path, *path.parents) if p.exists()), path)
    inside = f" (alignflow needs {path} in it)" if refusing != path else ""
    fix = fix or f"make it writable, or set {STATE_DIR_ENV} to a directory you can write"
    return f"{refusing}: cannot write there: {why}{inside}; {fix}"
