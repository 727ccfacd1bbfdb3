"""Citations resolve inside the checkout: `docs/<file>.md#<anchor>` naming a real heading, or a public URL.

(a) No tracked text file outside `docs/` still cites a document a newcomer cannot open: a section sign with a
number (the source reports' and the old framework references' sections), a report's overview or appendix, an
orchestration gotcha by number, or the old architecture page by section. `docs/seeds.md` keeps the reports' own
section numbers next to each fact, so that is the one place they may appear.
(b) Every `docs/<file>.md#<anchor>` cited anywhere in the repository names an existing page and one of its
headings' GitHub anchors.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SECTION = "\u00a7"  # written as an escape so that this file does not match its own patterns
OLD_CITATIONS = [
    (re.compile(SECTION + r"\s?\d"), "a numbered section of a document outside the checkout"),
    (re.compile(r"\b[Ss]eed \d{3}\W{0,3}(?:overview|appendix)\b"), "a source report's overview or appendix"),
    (re.compile(r"\breference G\d{1,2}\b", re.IGNORECASE), "an orchestration gotcha of the old reference"),
    # G1-G3 also name MindFormers' three log-line generations; the higher numbers are only ever orchestration gotchas
    (re.compile(r"(?<![\w-])G(?:[4-9]|1[0-7])\b"), "an orchestration gotcha by number"),
    (re.compile(r"\bARCHITECTURE\b"), "the old architecture page"),
]
DOCS_LINK = re.compile(r"\bdocs/(?P<page>(?:[\w-]+/)*[\w.-]+?\.md)(?:#(?P<anchor>[\w-]+))?")


# What .gitignore leaves out (and git's own directory): never the project's text. The walk reads the work tree
# in-process (the unit tier starts no process, so not `git ls-files`).
_IGNORED_DIRS = frozenset({".git", ".venv", "__pycache__", ".alignflow", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                           "build", "dist", "reports", ".whl", ".gl", "output", ".hypothesis"})


def _tracked_text_files(repo_root: Path) -> dict[str, str]:
    texts = {}
    for folder, dirs, files in os.walk(repo_root):
        dirs[:] = sorted(d for d in dirs if d not in _IGNORED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder, name)
            if name.endswith(".pyc") or path.is_symlink():
                continue
            try:
                texts[path.relative_to(repo_root).as_posix()] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # a binary file
    return texts


def github_anchor(heading: str) -> str:
    """The anchor GitHub generates for a markdown heading: markup dropped, lower case, punctuation removed
    (letters, digits, `_`, `-` and spaces kept), spaces become hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link contributes its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a page; a repeated heading gets `-1`, `-2`, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        heading = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_anchor(heading.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_github_anchor_follows_githubs_rules() -> None:
    assert github_anchor("Kill -0 is true for zombies") == "kill--0-is-true-for-zombies"
    assert github_anchor("The `training_log` line") == "the-training_log-line"
    assert github_anchor("GLM-5.2 criteria (mean error)") == "glm-52-criteria-mean-error"
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_no_citation_points_outside_the_checkout(repo_root: Path) -> None:
    offending = [f"{name}:{number}: {what}: {line.strip()[:100]}"
                 for name, text in _tracked_text_files(repo_root).items() if not name.startswith("docs/")
                 for number, line in enumerate(text.splitlines(), 1)
                 for pattern, what in OLD_CITATIONS if pattern.search(line)]
    assert not offending, "cite docs/<file>.md#<anchor> or a public URL instead:\n" + "\n".join(offending)


def test_every_docs_link_names_a_page_and_a_heading(repo_root: Path) -> None:
    docs = repo_root / "docs"
    pages = {path.relative_to(docs).as_posix(): anchors(path.read_text(encoding="utf-8"))
             for path in docs.rglob("*.md")}
    folders = {p.name for p in docs.iterdir() if p.is_dir()}
    # a page in a folder this repository's docs/ does not have is another project's (a Megatron log names its docs)
    links = [(name, number, m) for name, text in _tracked_text_files(repo_root).items()
             for number, line in enumerate(text.splitlines(), 1) for m in DOCS_LINK.finditer(line)
             if "/" not in m.group("page") or m.group("page").split("/")[0] in folders]
    broken = [f"{name}:{number}: {m.group(0)}" + ("" if m.group("page") in pages else " (no such page)")
              for name, number, m in links
              if m.group("page") not in pages or (m.group("anchor") or "") not in pages[m.group("page")] | {""}]
    assert links, "no docs/ link found: the pattern is wrong"
    assert not broken, "docs/ links whose page or heading does not exist:\n" + "\n".join(broken)
