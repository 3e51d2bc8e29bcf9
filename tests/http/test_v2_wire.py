"""The body plumbing under /v1 and /v2: inflating compressed bodies with a cap, and where CPU work runs."""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest

from service.dataplane.errors import ServiceError
from service.dataplane.inference import TensorSpec
from service.dataplane.tensors import TensorLimits
from service.http.bodies import inflate
from service.http.errors import ProblemError
from service.http.v2.tensors import parse_request

DATA = b'{"inputs": []}' * 100


def gz(data: bytes) -> bytes:
    """``data`` gzipped with a fixed header time: the same parameters (and test ids) in every process."""
    return gzip.compress(data, mtime=0)


@pytest.mark.parametrize(
    "encoding, body",
    [
        ("gzip", gz(DATA)),
        ("x-gzip", gz(DATA)),
        ("gzip", gz(DATA[:700]) + gz(DATA[700:])),  # concatenated members
        ("deflate", zlib.compress(DATA)),
    ],
    ids=["gzip", "x-gzip", "gzip-members", "deflate"],
)
def test_inflate(encoding: str, body: bytes) -> None:
    assert inflate(body, encoding, len(DATA)) == DATA


@pytest.mark.parametrize(
    "body, encoding, cap, status, fragment",
    [
        (gz(DATA), "gzip", len(DATA) - 1, 413, "inflates to more than"),
        (gz(b"\0" * (1 << 24)), "gzip", 1 << 20, 413, "inflates to more than"),  # a bomb stops at the cap
        (gz(DATA)[:-12], "gzip", 1 << 20, 400, "truncated"),
        (b"plain text", "gzip", 1 << 20, 400, "not valid gzip"),
        (gz(DATA), "deflate", 1 << 20, 400, "not valid deflate"),
        (DATA, "br", 1 << 20, 415, "not supported"),
    ],
    ids=["over-cap", "bomb", "truncated", "not-gzip", "gzip-as-deflate", "brotli"],
)
def test_inflate_refuses(body: bytes, encoding: str, cap: int, status: int, fragment: str) -> None:
    with pytest.raises(ProblemError) as err:
        inflate(body, encoding, cap)
    assert err.value.status == status and fragment in err.value.detail


FP32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("size", [4, 64, 65, 1000])  # the tiny-tensor check in Python and numpy's past 64 values
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_fp32_data_beyond_float32_is_named_at_every_size(size: int, sign: float) -> None:
    spec = TensorSpec("x", ("FP32", "FP64"), min_rank=1)
    limits = TensorLimits(max_rank=4, max_dim=1 << 20, max_elements=1 << 24)

    def parse(data: list[float]) -> np.ndarray:
        obj = {"inputs": [{"name": "x", "shape": [len(data)], "datatype": "FP32", "data": data}]}
        request = parse_request(obj, memoryview(b""), model="m", inputs=[spec], outputs=["y"], limits=limits)
        return request.inputs["x"]

    data = [0.5] * size
    data[-1] = sign * FP32_MAX  # the largest float32 fits
    assert parse(data)[-1] == sign * FP32_MAX
    data[-1] = sign * 3.5e38
    with pytest.raises(ServiceError) as caught:
        parse(data)
    assert caught.value.message.startswith(f"input 'x': data[{size - 1}] = {sign * 3.5e38:g} overflows FP32")
