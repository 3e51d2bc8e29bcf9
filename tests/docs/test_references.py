"""References to the documentation from the repository's files point at pages and sections that exist.

Comments, docstrings and pages name the documentation as a path, ``docs/operations/image.md``, optionally with an
anchor (``docs/concepts/masks.md#causal-masks``) or the sections' titles in quotes (``docs/concepts/contract.md,
"Shapes"``), and the README the same way (``README, "<heading>"``, or ``README's "<start>" line`` for one of its
lines). Every such reference in a tracked file must name a page that exists and headings that page has: when the
README lost a section, or a page was moved, what still pointed at it fails here. mkdocs checks the links between
the site's own pages (``make docs``, strict); the Markdown files outside docs/ (the README above all) are checked
here, and so is that no file reaches outside the repository.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.docs.markdown import ROOT

THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its examples are not references
# Paths of other projects' documentation, quoted as theirs (Triton's binary tensor extension).
FOREIGN = {"docs/protocol/extension_binary_data.md"}

_TITLE = r'"[^"\n]+"'
REFERENCE = re.compile(
    r"(?<![\w/.-])(?P<page>docs/[\w./-]+\.md|README(?:\.md)?)(?P<anchor>#[\w-]+)?"
    rf"(?:(?:'s)?(?:,\s*|\s+\(?|\()(?P<titles>{_TITLE}(?:,\s*(?:#\s*)?{_TITLE})*)(?P<line>\s+line\b)?)?"
)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*(?:\{#(?P<id>[\w-]+)\})?\s*#*\s*$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def tracked() -> list[str]:
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [name for name in done.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def text(name: str) -> str | None:
    try:
        return (ROOT / name).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None  # images, ONNX graphs


def slug(title: str) -> str:
    """The anchor Python-Markdown's toc extension (mkdocs) gives a heading."""
    return re.sub(r"[\s-]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())


@cache
def headings(page: str) -> dict[str, str]:
    """A page's headings, outside code blocks: {title, lowercase and without backticks: its anchor}."""
    found: dict[str, str] = {}
    fence: str | None = None
    for line in (ROOT / page).read_text(encoding="utf-8").splitlines():
        if m := FENCE.match(line):
            fence = None if fence and m[1].startswith(fence) else fence or m[1]
        elif fence is None and (h := HEADING.match(line)):
            title = h["title"].replace("`", "")
            found[title.lower()] = h["id"] or slug(title)
    return found


def problems(page_text: str) -> Iterator[tuple[int, str]]:
    """(line, what is wrong) for every reference in ``page_text`` that misses."""
    for m in REFERENCE.finditer(page_text):
        line = page_text.count("\n", 0, m.start()) + 1
        page = "README.md" if m["page"].startswith("README") else m["page"]
        if page in FOREIGN:
            continue
        if not (ROOT / page).is_file():
            yield line, f"{m[0]!r}: there is no {page}"
            continue
        anchors = headings(page)
        if m["anchor"] and m["anchor"][1:] not in anchors.values():
            yield line, f"{m[0]!r}: {page} has no heading with the anchor {m['anchor']}"
        for title in re.findall(_TITLE, m["titles"] or ""):
            title = title.strip('"')
            if m["line"]:
                lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
                if not any(ln.startswith(title) for ln in lines):
                    yield line, f"{m[0]!r}: no line of {page} starts with {title!r}"
            elif title.replace("`", "").lower() not in anchors:
                yield line, f"{m[0]!r}: {page} has no section {title!r} (it has: {', '.join(anchors)})"


def link_problems(name: str, page_text: str) -> Iterator[tuple[int, str]]:
    """Relative links of a Markdown file outside docs/: the file exists, and the anchor in it."""
    folder = (ROOT / name).parent
    for m in LINK.finditer(page_text):
        target = m["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # http:, mailto: and the service's own paths
        path, _, anchor = target.partition("#")
        line = page_text.count("\n", 0, m.start()) + 1
        resolved = (folder / path).resolve() if path else ROOT / name
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            yield line, f"link {target}: there is no {path}"
        elif (
            anchor
            and resolved.suffix == ".md"
            and anchor not in headings(resolved.relative_to(ROOT).as_posix()).values()
        ):
            yield line, f"link {target}: no heading with that anchor"


def test_every_reference_to_the_documentation_exists() -> None:
    found = [
        f"{name}:{line}: {problem}"
        for name in tracked()
        if name != THIS and (content := text(name)) is not None
        for line, problem in problems(content)
    ]
    assert not found, "\n".join(found)


def test_the_markdown_outside_the_site_links_to_what_exists() -> None:
    markdown = [name for name in tracked() if name.endswith(".md") and not name.startswith("docs/")]
    assert "README.md" in markdown
    found = [
        f"{name}:{line}: {problem}" for name in markdown for line, problem in link_problems(name, text(name) or "")
    ]
    assert not found, "\n".join(found)


def test_nothing_reaches_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|\bshared/spec")
    found = [
        f"{name}:{content.count(chr(10), 0, m.start()) + 1}: {m[0]}"
        for name in tracked()
        if name != THIS and (content := text(name)) is not None
        for m in outside.finditer(content)
    ]
    assert not found, "\n".join(found)


def test_a_missing_page_section_or_anchor_fails() -> None:
    def wrong(sample: str) -> list[str]:
        return [problem for _, problem in problems(sample)]

    assert wrong('see docs/concepts/contract.md, "Shapes"; docs/concepts/masks.md#causal-masks') == []
    assert wrong('Makefile: the README\'s "Locked versions" line, README "Install and run"') == []
    assert wrong('(docs/concepts/contract.md ("Gradients",\n"Reference numbers"))') == []
    assert len(wrong('README "Deploy"')) == 1
    assert len(wrong('README, "Deploy", "Scaling"')) == 2
    assert len(wrong("README#deploy and docs/concepts/masks.md#no-such-heading")) == 2
    assert len(wrong("docs/operations/deploy.md")) == 1
    assert len(wrong('the README\'s "Pinned versions" line')) == 1
    assert len(wrong('docs/concepts/contract.md ("Normalizers", "Gradients")')) == 1
    assert wrong("tests/golden/README.md and https://example.com/docs/guide.md") == []
    links = "[a](docs/concepts/masks.md#causal-masks) [b](#a-first-request) [c](https://example.com) [d](/docs)\n"
    assert list(link_problems("README.md", links)) == []
    bad = "[a](docs/nope.md) [b](docs/concepts/masks.md#nope) [c](#nope) [d](../shared/x)"
    assert len(list(link_problems("README.md", bad))) == 4
