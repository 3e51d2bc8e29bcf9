"""The fenced blocks of the documentation's Markdown pages, and the comparisons the example tests make.

The conventions (docs/development/testing.md, "The documentation"):

- a ``sh`` block whose command is ``curl ... http://127.0.0.1:8000/...`` is a request; a ``json`` block right after
  it (nothing but blank lines between) is its expected answer;
- a ``python`` block preceded by ``<!-- docs-test: run -->`` is a script to run; a ``text`` block right after it is
  its expected standard output;
- a ``console`` block's ``$ attention-service ...`` lines are commands, each followed by its expected output;
- ``<!-- docs-test: skip -->`` before a block leaves it out.

Answers and outputs are compared number by number within ``ABS_TOL + REL_TOL * |expected|``; ``timing_ms`` is
ignored wherever it appears, and the string ``"..."`` stands for any value.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

ABS_TOL = 1e-4
REL_TOL = 1e-4
ANY = "..."
IGNORED_KEYS = frozenset({"timing_ms"})
SERVICE = "http://127.0.0.1:8000"
GRPC = "127.0.0.1:8001"

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!-- docs-test: (?P<what>run|skip) -->\s*$")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Block:
    page: str
    """The page, relative to the repository (docs/... or README.md)."""
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    text: str
    marker: str | None
    """``run`` or ``skip`` when the line before the fence says so."""
    following: Block | None = None
    """The next block when only blank lines separate the two."""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order, each with the block that directly follows it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[tuple[int, int, str, str, str | None]] = []  # start, end, lang, text, marker
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:  # closing fences are consumed with their block, so every fence met here opens one
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        lang = m["info"].strip().split(" ")[0] if m["info"].strip() else ""
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        text = "\n".join(line[indent:] if line.startswith(" " * indent) else line.lstrip() for line in lines[i + 1 : j])
        marker = None
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and (mm := _MARKER.match(lines[k])):
            marker = mm["what"]
        found.append((i, j, lang, text + "\n", marker))
        i = j + 1
    rel = path.relative_to(ROOT).as_posix()
    result: list[Block] = []
    for n in range(len(found) - 1, -1, -1):
        start, end, lang, text, marker = found[n]
        following = None
        if n + 1 < len(found) and all(not line.strip() for line in lines[end + 1 : found[n + 1][0]]):
            following = result[0]
        result.insert(0, Block(rel, start + 1, lang, text, marker, following))
    return result


def pages() -> Iterator[Path]:
    """The site's pages, and the README, whose examples are the first a reader meets."""
    yield ROOT / "README.md"
    yield from sorted(DOCS.rglob("*.md"))


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]


# ----------------------------------------------------------------------------------------------------- curl


@dataclass(frozen=True)
class CurlRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None


def is_curl(block: Block) -> bool:
    return block.lang in ("sh", "bash", "shell") and any(
        line.lstrip().startswith("curl ") for line in block.text.splitlines()
    )


def parse_curl(text: str) -> CurlRequest:
    """The request one ``curl`` command sends to the documented address (``http://127.0.0.1:8000``)."""
    words = shlex.split(text.replace("\\\n", " "))
    if not words or words[0] != "curl":
        raise ValueError(f"not one curl command: {text!r}")
    method, url, headers, body = "", "", {}, None
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-s", "-S", "-sS", "--silent", "--show-error", "-f", "--fail"):
            pass
        elif word in ("-X", "--request"):
            i += 1
            method = words[i]
        elif word in ("-H", "--header"):
            i += 1
            name, _, value = words[i].partition(":")
            headers[name.strip().lower()] = value.strip()
        elif word in ("-d", "--data", "--data-raw", "--data-binary"):
            i += 1
            body = words[i].encode()
        elif word.startswith("-"):
            raise ValueError(f"curl option {word} is not supported by the example tests")
        elif url:
            raise ValueError(f"one URL per curl command: {url} and {word}")
        else:
            url = word
        i += 1
    if not url.startswith(SERVICE + "/"):
        raise ValueError(f"examples address the service at {SERVICE}, not {url}")
    if body is not None and "content-type" not in headers:
        headers["content-type"] = "application/x-www-form-urlencoded"  # what curl -d sends
    return CurlRequest(method or ("POST" if body is not None else "GET"), url[len(SERVICE) :], headers, body)


# ----------------------------------------------------------------------------------------------------- comparisons


def close(expected: float, actual: float) -> bool:
    return abs(actual - expected) <= ABS_TOL + REL_TOL * abs(expected)


def mismatches(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """Where ``actual`` differs from ``expected`` (empty when they match)."""
    if isinstance(expected, str) and expected == ANY:
        return []
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected an object, got {json.dumps(actual)[:200]}"]
        want = {k for k in expected if k not in IGNORED_KEYS}
        have = {k for k in actual if k not in IGNORED_KEYS}
        problems = []
        if want != have:
            problems.append(f"{where}: keys {sorted(have)}, documented {sorted(want)}")
        for key in sorted(want & have):
            problems += mismatches(expected[key], actual[key], f"{where}.{key}")
        return problems
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{where}: expected {json.dumps(expected)[:200]}, got {json.dumps(actual)[:200]}"]
        pairs = enumerate(zip(expected, actual, strict=True))
        return [p for i, (e, a) in pairs for p in mismatches(e, a, f"{where}[{i}]")]
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        same = actual == expected and type(actual) is type(expected)
        return [] if same else [f"{where}: {actual!r}, documented {expected!r}"]
    if isinstance(expected, int | float):
        if isinstance(actual, bool) or not isinstance(actual, int | float):
            return [f"{where}: {actual!r}, documented the number {expected!r}"]
        if isinstance(expected, int) and isinstance(actual, int):
            return [] if expected == actual else [f"{where}: {actual}, documented {expected}"]
        return [] if close(float(expected), float(actual)) else [f"{where}: {actual!r}, documented {expected!r}"]
    raise TypeError(f"unexpected JSON value {expected!r}")


def text_mismatches(expected: str, actual: str) -> list[str]:
    """Line by line: the words as written (whitespace runs alike), the numbers within the tolerance."""
    want = [line.rstrip() for line in expected.rstrip("\n").splitlines()]
    have = [line.rstrip() for line in actual.rstrip("\n").splitlines()]
    if len(want) != len(have):
        return [f"{len(have)} lines, documented {len(want)}:\n{actual}"]
    problems = []
    for n, (w, h) in enumerate(zip(want, have, strict=True), 1):
        w_words, h_words = _NUMBER.split(w), _NUMBER.split(h)
        w_nums, h_nums = _NUMBER.findall(w), _NUMBER.findall(h)
        same_words = [" ".join(x.split()) for x in w_words] == [" ".join(x.split()) for x in h_words]
        same_numbers = len(w_nums) == len(h_nums) and all(
            close(float(a), float(b)) for a, b in zip(w_nums, h_nums, strict=True)
        )
        if not (same_words and same_numbers):
            problems.append(f"line {n}: {h!r}, documented {w!r}")
    return problems


def console_commands(block: Block) -> list[tuple[str, str]]:
    """The ``$ command`` lines of a console block, each with the output documented after it."""
    commands: list[tuple[str, str]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], ""))
        elif commands:
            command, output = commands[-1]
            commands[-1] = (command, output + line + "\n")
    return commands
