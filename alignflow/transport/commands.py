"""Shell text that runs on hosts: how a command gets the host's env and setup lines, and the file operations.

Every command is an argv list. The only shell involved is explicit (`bash -c SCRIPT alignflow ARG...`) and
every value reaches it as a positional argument, never spliced into the script text; the SSH edge quotes the
whole argv once with `shlex.join`. So a path or argument holding spaces, quotes, `;`, `$(...)` or a newline
is passed literally (issue 3, item 6).

Every script's first line names it (`# alignflow:stat`, see `script`): `ps` on the host shows which of ours a
process is, and a fake host (`alignflow.testing.FakeShell`) tells our commands apart by `script_name`.

The file operations are a table of small bash scripts, one round trip each, each beginning with the
host-side confinement check of `paths.CONFINE_SH`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from alignflow.config.hosts import ENV_NAME
from alignflow.transport.paths import CONFINE_SH

ARGV0 = "alignflow"  # $0 of every `bash -c` script: what `ps` shows for our shells
SETUP_FAILED_EXIT = 125


def check_env_names(env: Mapping[str, str]) -> None:
    """Environment names must be shell identifiers: they are written into `export NAME=...` lines."""
    bad = [k for k in env if not ENV_NAME.match(k)]
    if bad:
        raise ValueError(f"env: {', '.join(map(repr, bad))} not valid environment variable name(s)")


def render_prologue(
    *, host_env: Mapping[str, str], setup: Sequence[str], env: Mapping[str, str] | None, cwd: str | None
) -> str:
    """The lines that give a command its host environment: host env, setup lines, per-call env, cwd.

    Order matters: the host's `env` first, so that a setup line (e.g. CANN's set_env.sh) can build on it;
    the per-call env last, so that a step can override both. A failing setup line stops the command with
    exit status 125 and says which line failed, instead of running the command in a half-set-up shell.
    What setup lines print goes to stderr (CANN's set_env.sh and conda hooks chat): a command's stdout - a
    JSON answer, a hash manifest - stays the command's own. `host_env` is a `Host`'s, whose names `Host`
    validated; the per-call env is checked here.
    """
    check_env_names(env or {})
    lines = [f"export {k}={shlex.quote(v)}" for k, v in host_env.items()]
    for i, line in enumerate(setup, 1):
        msg = shlex.quote(f"alignflow: host setup line {i} failed: {line}")
        lines.append(f"{{ {line}\n}} >&2 || {{ printf '%s\\n' {msg} >&2; exit {SETUP_FAILED_EXIT}; }}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    if cwd is not None:
        lines.append(f"cd -- {shlex.quote(cwd)} || exit {SETUP_FAILED_EXIT}")
    return "\n".join(lines)


_TAG = f"# {ARGV0}:"


def script(name: str, body: str, *args: str, prologue: str = "") -> list[str]:
    """`bash -c SCRIPT alignflow ARGS...`: the script named on its first line, the prologue (if any) after it, then
    `body`. Every value travels as a positional parameter, never spliced into the text."""
    text = f"{_TAG}{name}\n{prologue}\n{body}" if prologue else f"{_TAG}{name}\n{body}"
    return ["bash", "-c", text, ARGV0, *args]


def script_name(argv: Sequence[str]) -> str | None:
    """The name `script` gave a command (`"stat"`, `"launch"`, ...); None for any other argv."""
    if len(argv) < 3 or argv[0] != "bash" or argv[1] != "-c" or not argv[2].startswith(_TAG):
        return None
    return argv[2][len(_TAG):].partition("\n")[0]


def with_prologue(argv: Sequence[str], prologue: str) -> list[str]:
    """`argv` with the host's prologue run first: spliced after the name line of one of our scripts (one bash, as
    ever), any other argv wrapped by `wrap_command`."""
    if not prologue:
        return list(argv)
    name = script_name(argv)
    if name is None or list(argv[3:4]) != [ARGV0]:
        return wrap_command(argv, prologue)
    return script(name, argv[2].partition("\n")[2], *argv[4:], prologue=prologue)


def wrap_command(argv: Sequence[str], prologue: str) -> list[str]:
    """`bash -c '<prologue>; "$@"; exit $?' alignflow ARGV...`: the argv travels as positional parameters.

    Not `exec "$@"`: a command killed by a signal would then end the SSH session with an exit *signal*,
    which paramiko cannot tell from a dropped connection; bash turns it into the exit status 128+N.
    """
    if not argv:
        raise ValueError("empty argv")
    return script("run", '"$@"\nexit $?', *argv, prologue=prologue)


def render_job_script(argv: Sequence[str], prologue: str, *, header: str) -> str:
    """The rendered command of a detached job (`cmd.sh` in its job dir): readable, and runnable by hand."""
    comment = "\n".join(f"# {line}" for line in header.splitlines())
    return f"#!/bin/bash\n{comment}\n{prologue}\nexec {shlex.join(argv)}\n"


def op_argv(op: str, workdir_real: str, *args: str) -> list[str]:
    """argv of a file operation from `OPS` (named `op`); `$1` is the real workdir, the operation's arguments follow."""
    return script(op, CONFINE_SH + "W=$1; shift\n" + OPS[op], workdir_real, *args)


# Exit status with which operations report a missing path.
MISSING_EXIT = 3

OPS: dict[str, str] = {
    # $1: path -> "1" or "0"
    "exists": 'af_confine "$W" "$1"; if [ -e "$1" ]; then echo 1; else echo 0; fi',
    # $1: path -> "kind|size|mtime_ns|mode(octal)" ; symlinks followed
    "stat": (
        'af_confine "$W" "$1"; [ -e "$1" ] || exit 3\n'
        "LC_ALL=C stat -L -c '%F|%s|%.9Y|%a' -- \"$1\""
    ),
    # $1: path -> created (parents too, mode 700 for new ones: workdirs hold private artifacts)
    "mkdir": 'af_confine "$W" "$1"; mkdir -p -m 700 -- "$1"',
    # $1: path, $2: max bytes -> content; exit 4 when larger
    "read": (
        'af_confine "$W" "$1"; [ -f "$1" ] || exit 3\n'
        'n=$(stat -L -c %s -- "$1") || exit 3; [ "$n" -le "$2" ] || { echo "$n" >&2; exit 4; }\n'
        'cat -- "$1"'
    ),
    # $1: path; content on stdin -> written to a temporary name and renamed (readers never see half a file)
    "write": (
        'af_confine "$W" "$1"; d=${1%/*}; d=${d:-/}; mkdir -p -m 700 -- "$d" || exit 1\n'
        't=$(mktemp -- "$d/.af-write.XXXXXX") || exit 1\n'
        'cat > "$t" && chmod 600 -- "$t" && mv -f -- "$t" "$1" || { rm -f -- "$t"; exit 1; }'
    ),
    # $1: path, $2: "1" for recursive; never the workdir itself
    "remove": (
        'af_confine "$W" "$1"; af_real "$1"\n'
        '[ "$AF_REAL" != "$W" ] || { echo "refusing to remove the workdir" >&2; exit 5; }\n'
        '[ -e "$1" ] || [ -L "$1" ] || exit 0\n'
        'if [ "$2" = 1 ]; then rm -rf -- "$1"; elif [ -d "$1" ] && [ ! -L "$1" ]; then rmdir -- "$1"; '
        'else rm -f -- "$1"; fi'
    ),
    # $1: a copy's final path, $2: the staging stem of copies to it (transfer._staging_stem) -> every
    # "<dir of $1>/<stem>-*" removed, their names printed NUL-separated. Run under the destination's lock only.
    "clean_staging": (
        'af_confine "$W" "$1"; d=${1%/*}; d=${d:-/}; rc=0\n'
        'for p in "$d/$2"-*; do\n'
        '  [ -e "$p" ] || [ -L "$p" ] || continue\n'
        '  if rm -rf -- "$p"; then printf "%s\\0" "$p"; else rc=1; fi\n'
        'done\n'
        'exit "$rc"'
    ),
    # $1: staged copy, $2: final path, $3: "1" to replace what is there. Never replaces anything otherwise:
    # rename(2) of a directory fails on a non-empty target, link(2) of a file fails on any target. Exit 6 when
    # the final path is taken. On success the staging directory that held $1 is removed if it is now empty.
    "place": (
        'af_confine "$W" "$1" "$2"\n'
        'af_place() {\n'
        '  if [ -e "$2" ] || [ -L "$2" ]; then\n'
        '    [ "$3" = 1 ] || return 6\n'
        '    old="${2%/*}/.af-replaced-$$-${2##*/}"\n'
        '    mv -T -- "$2" "$old" || return 1\n'
        '    mv -T -- "$1" "$2" || { mv -T -- "$old" "$2"; return 1; }\n'
        '    rm -rf -- "$old"; return 0\n'
        '  fi\n'
        '  if [ -d "$1" ] && [ ! -L "$1" ]; then mv -T -- "$1" "$2" 2>/dev/null && return 0; [ -e "$2" ] && return 6; '
        'return 1; fi\n'
        '  ln -T -- "$1" "$2" 2>/dev/null && { rm -f -- "$1"; return 0; }\n'
        '  [ -e "$2" ] && return 6\n'
        '  mv -n -T -- "$1" "$2" && [ ! -e "$1" ] || return 6\n'
        '}\n'
        'af_place "$@"; rc=$?\n'
        '[ "$rc" = 0 ] && rmdir -- "${1%/*}" 2>/dev/null\n'
        'exit "$rc"'
    ),
}
