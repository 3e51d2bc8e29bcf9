"""The body plumbing under /v1 and /v2: inflating compressed bodies with a cap, and where CPU work runs."""

from __future__ import annotations

import gzip
import zlib

import pytest

from service.http.bodies import inflate
from service.http.errors import ProblemError

DATA = b'{"inputs": []}' * 100


@pytest.mark.parametrize(
    "encoding, body",
    [
        ("gzip", gzip.compress(DATA)),
        ("x-gzip", gzip.compress(DATA)),
        ("gzip", gzip.compress(DATA[:700]) + gzip.compress(DATA[700:])),  # concatenated members
        ("deflate", zlib.compress(DATA)),
    ],
)
def test_inflate(encoding: str, body: bytes) -> None:
    assert inflate(body, encoding, len(DATA)) == DATA


@pytest.mark.parametrize(
    "body, encoding, cap, status, fragment",
    [
        (gzip.compress(DATA), "gzip", len(DATA) - 1, 413, "inflates to more than"),
        (gzip.compress(b"\0" * (1 << 24)), "gzip", 1 << 20, 413, "inflates to more than"),  # a bomb stops at the cap
        (gzip.compress(DATA)[:-12], "gzip", 1 << 20, 400, "truncated"),
        (b"plain text", "gzip", 1 << 20, 400, "not valid gzip"),
        (gzip.compress(DATA), "deflate", 1 << 20, 400, "not valid deflate"),
        (DATA, "br", 1 << 20, 415, "not supported"),
    ],
)
def test_inflate_refuses(body: bytes, encoding: str, cap: int, status: int, fragment: str) -> None:
    with pytest.raises(ProblemError) as err:
        inflate(body, encoding, cap)
    assert err.value.status == status and fragment in err.value.detail
