"""The help and usage errors in the house style of click and typer (issue 47), over what typer 0.29 prints.

typer 0.29 rewrote its help: arguments read `{experiment}` / `[run_id]`, every option shows its Python type
(`<str>`, `<list[str]>`, `<bool>` on a flag), a command's description keeps the docstring's line breaks (ragged at any
width but the source's), an option's help sits in rich `Columns` that cut a long token with "…", and a usage error is
a boxed panel under the usage line. click's style, which the guides and users expect, is: upper-case metavars
(`EXPERIMENT`, `[RUN_ID]`, `LOGS...`), click's type names (`TEXT`, `PATH`, `INTEGER RANGE`, `[a|b]`), paragraphs
wrapped at the terminal's width (a paragraph starting with `\\b` kept as written), and one line per error.

`install()` swaps those few hooks of typer's classes (cheap: `typer.core` is loaded anyway); the patch of typer's
help renderer waits for the first help page, so that a command that prints no help never loads `typer.rich_utils`
(rich's markdown, ~40 ms). tests/cli/test_help.py renders every command's help and holds it to this style, so a
typer upgrade that moves a hook fails there, not in front of a user.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

# typer's type descriptor -> click's name for it (click.types: STRING is TEXT, INT is INTEGER, ...).
_TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "BOOLEAN", "datetime": "DATETIME",
               "UUID": "UUID"}
_PATH_NAMES = {"file": "FILE", "dir": "DIRECTORY", "path": "PATH"}
# How close a mistyped command or option must be to be suggested (difflib's ratio, without the dashes): click's
# 0.6 offers `logs` for `bogus` and `--verbose` for `--bogus`.
SUGGEST_CUTOFF = 0.7


def _type_name(annotation: Any) -> str:
    name = getattr(annotation, "__name__", str(annotation))
    return _TYPE_NAMES.get(name, name.upper())


def _display_type(self: Any, ctx: Any) -> str:
    """click's metavar of a parameter's type: TEXT, PATH, INTEGER RANGE, [auto|raw], <TEXT INTEGER>; a repeatable
    option shows its element's type (click says "repeatable" in the help, not in the type)."""
    from typing import get_args

    desc = self.type_descriptor
    if desc.is_choice:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in desc.choices or ()) + "]"
    if desc.is_path:
        return _PATH_NAMES.get(desc.path_type, "PATH")
    if desc.is_ranged:
        return f"{_type_name(desc.annotation)} RANGE"
    if desc.is_tuple:
        return "<" + " ".join(_type_name(a) for a in get_args(desc.annotation)) + ">"
    if desc.is_list:
        (element,) = get_args(desc.annotation)
        return _type_name(element)
    return _type_name(desc.annotation)


def _option_type(self: TyperOption, ctx: Any) -> str | None:
    # A flag's help line shows just the flag (typer labels flags too: `--json <bool>`).
    if self.is_flag:
        return None
    return self.metavar or _display_type(self, ctx)


def _argument_name(self: TyperArgument) -> str:
    return self.metavar or (self.name or "").upper()


def _argument_usage(self: TyperArgument) -> str:
    name = _argument_name(self)
    name = name if self.required else f"[{name}]"
    return f"{name}..." if self.nargs != 1 else name


def _reflow(paragraph: str) -> str:
    """A paragraph of a docstring as one line (the console wraps it), unless it starts with click's `\\b`."""
    if paragraph.startswith("\b"):
        return paragraph.removeprefix("\b").strip("\n")
    return " ".join(paragraph.split())


def reflow(text: str) -> str:
    """Every paragraph of `text` (split at blank lines) reflowed as `_reflow` does."""
    return "\n\n".join(_reflow(p) for p in text.split("\n\n"))


_patched_renderer = False


def _patch_renderer() -> None:
    """Paragraphs rewrapped; an option's help, default and `[required]` as one wrapping text, not `Columns`."""
    global _patched_renderer
    if _patched_renderer:
        return
    _patched_renderer = True
    import inspect

    from rich.text import Text
    from typer import rich_utils

    def fix_linebreaks(paragraphs: list[str], markup_mode: Any) -> str:
        return "\n\n".join(_reflow(p) for p in paragraphs)

    make_command_help = rich_utils._make_command_help

    def command_help(*, help_text: str, markup_mode: Any) -> Any:
        first = inspect.cleandoc(help_text).split("\n\n")[0]
        return make_command_help(help_text=_reflow(first), markup_mode=markup_mode)

    parameter_help = rich_utils._get_parameter_help

    def one_text(**kwargs: Any) -> Any:
        columns = parameter_help(**kwargs)
        items = [item for item in columns.renderables if isinstance(item, Text)]
        if len(items) == len(columns.renderables):
            joined = Text(" ").join(items)
            joined.overflow = "fold"  # a token longer than the column folds, never ends in "…"
            return joined
        return columns

    rich_utils._fix_linebreaks = fix_linebreaks
    rich_utils._make_command_help = command_help
    rich_utils._get_parameter_help = one_text


def _lazily_patched(format_help: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, ctx: Any, formatter: Any) -> Any:
        _patch_renderer()
        return format_help(self, ctx, formatter)

    return wrapper


def install() -> None:
    """Put typer's help and usage line in click's house style (once per process)."""
    if getattr(TyperArgument, "_alignflow_style", False):
        return
    TyperArgument._alignflow_style = True  # type: ignore[attr-defined]
    TyperArgument.display_name_raw = property(_argument_name)  # type: ignore[assignment,method-assign]
    TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
    TyperArgument.display_type = _display_type  # type: ignore[method-assign]
    TyperOption.display_type = _display_type  # type: ignore[method-assign]
    TyperOption.display_type_rich = _option_type  # type: ignore[method-assign]
    TyperCommand.format_help = _lazily_patched(TyperCommand.format_help)  # type: ignore[method-assign]
    TyperGroup.format_help = _lazily_patched(TyperGroup.format_help)  # type: ignore[method-assign]


def close_options(option: str, ctx: Any) -> list[str]:
    """The command's options close to a mistyped `--option`: compared without their dashes, so that `--bogus` is
    not "close" to `--verbose` for the two dashes they share (click's own suggestion)."""
    if ctx is None:
        return []
    names = [name for param in ctx.command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)
             if name.startswith("--")]
    stripped = {name.lstrip("-"): name for name in names}
    close = difflib.get_close_matches(option.lstrip("-"), list(stripped), n=2, cutoff=SUGGEST_CUTOFF)
    return [stripped[m] for m in close]


def usage_error_line(exc: Any) -> str:
    """One line for a click usage error: `<command>: <what>[ (did you mean ...?)]; see '<command> --help'`."""
    ctx = getattr(exc, "ctx", None)
    command = re.match(r"No such command '(.*)'\.", getattr(exc, "message", ""))
    if type(exc).__name__ == "NoSuchOption":
        close = close_options(exc.option_name, ctx)
        message = exc.message + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else "")
    elif command and ctx is not None:
        close = difflib.get_close_matches(command[1], ctx.command.list_commands(ctx), n=2,
                                            cutoff=SUGGEST_CUTOFF)
        message = f"No such command '{command[1]}'" + (
            f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else "")
    else:
        message = exc.format_message()
    message = re.sub(r"\s+", " ", message.replace("Value error, ", "")).strip().rstrip(".")
    missing = re.search(r"path '(.+)' does not exist", message)
    if missing:
        from alignflow.errors import did_you_mean_file

        message += did_you_mean_file(missing[1])
    if ctx is None:
        return message
    return f"{ctx.command_path}: {message}; see '{ctx.command_path} --help'"
