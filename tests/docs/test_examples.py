"""The documentation's examples, run against a live server: what docs/ shows is what the service answers.

One server for the module, started as ``make serve`` starts it (default settings: ONNX on), with gRPC on a free
port. The conventions are in tests/docs/markdown.py and docs/development/testing.md: every ``curl`` example is
sent and its answer compared with the ``json`` block that follows it; every Python block marked
``<!-- docs-test: run -->`` runs with the addresses replaced by the live server's, its output compared with the
``text`` block that follows it; every ``$ attention-service`` command of a ``console`` block runs and its output is
compared with the lines after it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.docs.markdown import (
    GRPC,
    ROOT,
    SERVICE,
    Block,
    all_blocks,
    console_commands,
    is_curl,
    mismatches,
    parse_curl,
    text_mismatches,
)
from tests.e2e.conftest import free_port, started
from tests.grpc.conftest import wait_serving

pytestmark = pytest.mark.slow

BLOCKS = all_blocks()
CURL = [b for b in BLOCKS if is_curl(b) and b.marker != "skip"]
PYTHON = [b for b in BLOCKS if b.lang == "python" and b.marker == "run"]
CONSOLE = [b for b in BLOCKS if b.lang == "console" and b.marker != "skip"]


@dataclass(frozen=True)
class Servers:
    url: str
    """REST, ``http://host:port``."""
    grpc: str
    """gRPC, ``host:port``."""

    def localize(self, text: str) -> str:
        """The documented addresses replaced by this server's."""
        authority = self.url.split("//", 1)[1]
        return text.replace(SERVICE, self.url).replace("127.0.0.1:8000", authority).replace(GRPC, self.grpc)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    host, port, grpc_port = "127.0.0.1", free_port(), free_port()
    env = {"ATTN_LOG_LEVEL": "warning", "ATTN_GRPC_PORT": str(grpc_port)}
    args = ["-m", "service", "serve", "--host", host, "--port", str(port)]
    with started(args, port, env, host) as server:
        wait_serving(f"{host}:{grpc_port}")
        yield Servers(server.url, f"{host}:{grpc_port}")


def test_the_docs_have_examples_of_each_kind() -> None:
    """The collection itself: a page rename or a broken fence would silently leave examples untested."""
    assert len(CURL) >= 15 and len(PYTHON) >= 6 and len(CONSOLE) >= 2, (len(CURL), len(PYTHON), len(CONSOLE))
    for block in BLOCKS:
        if block.marker == "run":
            assert block.lang == "python", f"{block.where}: only python blocks are run"


@pytest.mark.parametrize("block", [b for b in BLOCKS if is_curl(b)], ids=lambda b: b.where)
def test_every_curl_example_addresses_the_service_or_is_skipped(block: Block) -> None:
    """A ``curl`` example is one command to http://127.0.0.1:8000; anything else is marked skip, on purpose."""
    if block.marker == "skip":
        return
    lines = [line for line in block.text.replace("\\\n", " ").splitlines() if line.strip()]
    assert lines[0].startswith("curl "), f"{block.where}: mark a block that mixes commands <!-- docs-test: skip -->"
    parse_curl(block.text)  # raises with the reason when the example is not one the tests can send


@pytest.mark.parametrize("block", CURL, ids=lambda b: b.where)
def test_curl_example(block: Block, servers: Servers) -> None:
    request = parse_curl(block.text)
    with httpx.Client(base_url=servers.url, timeout=60) as client:
        r = client.request(request.method, request.path, headers=request.headers, content=request.body)
    answer = block.following
    if answer is None or answer.lang != "json":
        assert r.is_success, f"{block.where}: {r.status_code} {r.text[:500]}"
        return
    expected = json.loads(answer.text)
    if isinstance(expected, dict) and {"type", "title", "status"} <= set(expected):
        assert r.status_code == expected["status"], f"{block.where}: {r.status_code} {r.text[:500]}"
    else:
        assert r.is_success, f"{block.where}: {r.status_code} {r.text[:500]}"
    problems = mismatches(expected, r.json())
    assert not problems, f"{block.where} ({answer.where}):\n" + "\n".join(problems[:20])


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.where)
def test_python_example(block: Block, servers: Servers) -> None:
    done = subprocess.run(
        [sys.executable, "-c", servers.localize(block.text)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"{block.where}:\n{done.stderr[-3000:]}"
    output = block.following
    if output is not None and output.lang == "text":
        problems = text_mismatches(output.text, done.stdout)
        assert not problems, f"{block.where} ({output.where}):\n" + "\n".join(problems)


@pytest.mark.parametrize("block", CONSOLE, ids=lambda b: b.where)
def test_console_example(block: Block, servers: Servers) -> None:
    commands = console_commands(block)
    assert commands, f"{block.where}: a console block without a $ command"
    for command, expected in commands:
        words = shlex.split(command)
        assert words[0] == "attention-service", f"{block.where}: only attention-service commands run: {command}"
        done = subprocess.run(
            [sys.executable, "-m", "service", *words[1:]],
            cwd=ROOT,
            env={**os.environ, "ATTENTION_URL": servers.url, "COLUMNS": "100"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{block.where}: {command}\n{done.stderr[-2000:]}"
        problems = text_mismatches(expected, done.stdout)
        assert not problems, f"{block.where}: {command}\n" + "\n".join(problems)
