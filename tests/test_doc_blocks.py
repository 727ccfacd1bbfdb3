"""Every shell block a user reads in README.md and docs/guide/ is run by a journey, or says why not and parses.

A fenced `bash`/`sh`/`shell`/`console` block must carry, on the line right above its fence, either
`<!-- journey: NAME -->` (tests/journeys/ runs it as written) or `<!-- not-run: WHY -->` (what it needs that this
machine lacks: a real Ascend or GPU host, Slurm, a team server, a recorded run). A block that is not run is still
checked as far as can be without running it, against the real things it names:

- an `alignflow ...` line (also `.venv/bin/alignflow`) against alignflow's own command line, through its parser's
  declarations (typer's vendored click), as `--help` sees them: each subcommand exists, each option exists on
  the command it is given to, no more
  positional arguments than the command takes. Usage notation is read as such: `[--opt]` optional, `a|b`
  alternatives (each must exist), `...` repetition, `\\` and indented continuation lines;
- `make TARGET` against the Makefile's targets; `python -m MODULE` against the modules that exist; `python PATH.py`
  and `torchrun ... PATH.py` against the checkout's files.

Other commands (ssh, docker, sed, export) are the user's shell's and are left alone. Nothing is executed: this is
the unit tier.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperArgument, TyperGroup, TyperOption

from alignflow.cli import app

SHELL_LANGS = frozenset({"bash", "sh", "shell", "console"})
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w-]*)\s*$")
RUN_MARK = re.compile(r"^<!--\s*journey:\s*[\w-]+")
NOT_RUN_MARK = re.compile(r"^<!--\s*not-run:\s*(?P<why>\S.*?)\s*-->$")


@dataclass(frozen=True)
class ShellBlock:
    path: Path
    line: int  # of the opening fence (1-based)
    marker: str  # "journey" | "not-run" | ""
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.path.as_posix()}:{self.line}"


def user_pages(repo: Path) -> list[Path]:
    """The pages a user follows: the README and the guides (docs/reference and the cited pages show formats)."""
    return [repo / "README.md", *sorted((repo / "docs" / "guide").rglob("*.md"))]


def shell_blocks(path: Path) -> list[ShellBlock]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i].strip())
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == opening["fence"]), len(lines))
        if opening["lang"] in SHELL_LANGS:
            above = lines[i - 1].strip() if i > 0 else ""
            marker = "journey" if RUN_MARK.match(above) else "not-run" if NOT_RUN_MARK.match(above) else ""
            found.append(ShellBlock(path, i + 1, marker, tuple(lines[i + 1:end])))
        i = end + 1
    return found


def logical_lines(block: ShellBlock) -> list[str]:
    """The block's command lines: comments dropped, `\\` continuations and indented usage continuations joined,
    `&&` and `;` split."""
    joined: list[str] = []
    continued = False
    for raw in block.lines:
        text = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not text.strip():
            continued = False
            continue
        indented_usage = raw[:1].isspace() and text.lstrip()[:1] in ("[", "-") and joined
        if (continued or indented_usage) and joined:
            joined[-1] += " " + text.strip()
        else:
            joined.append(text.strip())
        continued = text.endswith("\\")
        if continued:
            joined[-1] = joined[-1][:-1].rstrip()
    return [part.strip() for line in joined for part in re.split(r"\s(?:&&|;)\s|;\s*$|;\s+", line) if part.strip()]


def _words(line: str) -> list[str]:
    """Shell words of a usage line: `[`/`]` dropped, `...`/`…` dropped, quotes as the shell reads them."""
    text = line.replace("[", " ").replace("]", " ").replace("...", " ").replace("…", " ")
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def check_alignflow(words: list[str], root: TyperGroup) -> list[str]:
    """What of `alignflow WORDS` alignflow's parser would refuse: an unknown command or option, too many
    arguments."""
    command: Any = root
    path = ["alignflow"]
    i = 0
    # the group's own options (--version, --help) and its subcommands, one level per group
    while isinstance(command, TyperGroup) and i < len(words):
        word = words[i]
        if word.startswith("-"):
            problem = _option_problem(command, word, path)
            if problem:
                return [problem]
            i += 1
            continue
        names = word.split("|")
        missing = [n for n in names if n not in command.commands]
        if missing:
            return [f"`{' '.join(path)}` has no command {missing[0]!r} (it has: {', '.join(sorted(command.commands))})"]
        if len(names) > 1:  # alternatives: each exists; check the rest of the line against the first
            for alternative in names[1:]:
                if isinstance(command.commands[alternative], TyperGroup):
                    return [f"`{' '.join(path)} {word}`: an alternative is a group; write the lines out"]
        command = command.commands[names[0]]
        path.append(names[0])
        i += 1
    if isinstance(command, TyperGroup):
        return []  # `alignflow hosts` alone: the group's help
    problems, positionals = [], 0
    rest = words[i:]
    j = 0
    while j < len(rest):
        word = rest[j]
        if word == "|" or word == "--":
            j += 1
            continue
        if word.startswith("-") and len(word) > 1 and not _is_number(word):
            problem = _option_problem(command, word, path)
            if problem:
                problems.append(problem)
            elif "=" not in word and _takes_value(command, word) and j + 1 < len(rest) \
                    and not rest[j + 1].startswith("-"):
                j += 1  # its value (a usage line may leave it out: `[--side ...] [--json]`)
            j += 1
            continue
        positionals += 1
        j += 1
    arguments = [p for p in command.params if isinstance(p, TyperArgument)]
    if any(a.nargs == -1 for a in arguments):
        return problems
    if positionals > sum(a.nargs for a in arguments):
        problems.append(f"`{' '.join(path)}` takes {sum(a.nargs for a in arguments)} argument(s), the line gives "
                        f"{positionals}: {' '.join(words)}")
    return problems


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _option(command: Any, word: str) -> TyperOption | None:
    name = word.split("=", 1)[0]
    for param in command.params:
        if isinstance(param, TyperOption) and (name in param.opts or name in param.secondary_opts):
            return param
    return None


def _option_problem(command: Any, word: str, path: list[str]) -> str | None:
    if _option(command, word) is None and word != "--help":  # --help: every command's, added by click
        return f"`{' '.join(path)}` has no option {word.split('=', 1)[0]!r}"
    return None


def _takes_value(command: Any, word: str) -> bool:
    option = _option(command, word)
    return option is not None and not option.is_flag and not option.count


def makefile_targets(repo: Path) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([\w.-]+)\s*:(?!=)", (repo / "Makefile").read_text(), re.M)}


def check_line(line: str, repo: Path, root: TyperGroup) -> list[str]:
    words = _words(line)
    if not words:
        return []
    program = words[0]
    if program.endswith("alignflow") and program in ("alignflow", ".venv/bin/alignflow"):
        return check_alignflow(words[1:], root)
    if program == "make":
        targets = makefile_targets(repo)
        return [f"the Makefile has no target {w!r}" for w in words[1:] if "=" not in w and not w.startswith("-")
                and w not in targets]
    if re.fullmatch(r"(\.venv/bin/)?python(3(\.\d+)?)?", program) or program == "torchrun":
        if "-m" in words and program != "torchrun":
            module = words[words.index("-m") + 1]
            if module.startswith("alignflow") and importlib.util.find_spec(module) is None:
                return [f"no module {module!r}"]
            return []
        scripts = [w for w in words[1:] if w.endswith(".py")]
        return [f"no file {s!r} in the checkout" for s in scripts[:1] if not (repo / s).is_file()]
    return []


def _all_blocks(repo: Path) -> list[ShellBlock]:
    return [block for page in user_pages(repo) for block in shell_blocks(page)]


def test_every_shell_block_is_run_by_a_journey_or_says_why_not(repo_root: Path) -> None:
    blocks = _all_blocks(repo_root)
    assert len(blocks) > 10, "no shell blocks found: the fence pattern is wrong"
    unmarked = [f"{b.path.relative_to(repo_root)}:{b.line}" for b in blocks if not b.marker]
    assert not unmarked, ("mark each block `<!-- journey: NAME -->` (and run it in tests/journeys/) or "
                          "`<!-- not-run: WHY -->` on the line above its fence:\n" + "\n".join(unmarked))


def test_every_command_of_a_block_not_run_parses_with_what_it_names(repo_root: Path) -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    problems = [f"{b.path.relative_to(repo_root)}:{b.line}: {problem}"
                for b in _all_blocks(repo_root) if b.marker != "journey"
                for line in logical_lines(b) for problem in check_line(line, repo_root, root)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("line", "problem"), [
    ("alignflow compare a.log b.log --labels A,B", None),
    ("alignflow compare a.log b.log --lables A,B", "has no option '--lables'"),
    ("alignflow comprae a.log b.log", "has no command 'comprae'"),
    ("alignflow server start|stop|status", None),
    ("alignflow server start|halt", "has no command 'halt'"),
    ("alignflow run experiments/demo.yaml [--from STEP] [--quiet | --verbose]", None),
    ("alignflow show RUN extra", "takes 1 argument(s)"),
    ("alignflow hosts trust npu-a --hosts hosts.yaml", None),
    ("alignflow history [--experiment ...] [--limit 5] RUN", None),  # a value left out, then one given
    ("alignflow history [--experiment ...] [--json] RUN RUN", "takes 1 argument(s)"),
    ("make tset", "no target 'tset'"),
    ("python benchmarks/no_such_bench.py", "no file"),
    ("python -m alignflow.no_such_module", "no module"),
])
def test_the_check_refuses_what_the_parser_would(line: str, problem: str | None, repo_root: Path) -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    found = check_line(line, repo_root, root)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1, found
        assert problem in found[0], found


def test_usage_lines_join_their_continuations(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("<!-- not-run: x -->\n```bash\n# a comment\nalignflow convert megatron A B --spec s \\\n"
                    "    --json\nalignflow run X [--from S]\n                   [--quiet]   # wraps\n"
                    "alignflow --version;  alignflow --help\n```\n")
    (block,) = shell_blocks(page)
    assert block.marker == "not-run"
    assert logical_lines(block) == ["alignflow convert megatron A B --spec s --json",
                                    "alignflow run X [--from S] [--quiet]", "alignflow --version", "alignflow --help"]


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def test_every_relative_link_of_the_docs_names_a_page_and_a_heading(repo_root: Path) -> None:
    """The pages moved out of the README link each other relatively (`[Slurm](slurm.md#slurm-hosts)`): each link
    names a file of the checkout and, for a page, one of its headings' GitHub anchors (tests/test_citations.py)."""
    from tests.test_citations import anchors

    pages = [repo_root / "README.md", *sorted((repo_root / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        in_code = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            for match in LINK.finditer(line):
                target = match["target"]
                if re.match(r"[a-z]+:", target):
                    continue  # a URL
                file, _, anchor = target.partition("#")
                path = (page.parent / file).resolve() if file else page
                if not path.exists():
                    broken.append(f"{page.relative_to(repo_root)}:{number}: {target} (no such file)")
                elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text(encoding="utf-8")):
                    broken.append(f"{page.relative_to(repo_root)}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
