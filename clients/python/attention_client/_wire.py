"""Wire helpers: tensors to and from the service's ``b64`` form, and JSON in and out.

The ``b64`` form (docs/concepts/fixed-names.md, "Tensors on the wire") is ``{"shape", "dtype", "b64"}`` with the
base64 of the little-endian C-order bytes, so large arrays are neither printed as JSON text
nor parsed back from it. orjson and pybase64 are used when installed (``attention-client[fast]``);
the standard library otherwise.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

try:  # optional speed-ups; the results are the same
    import pybase64 as _b64

    def _b64encode(data: bytes) -> str:
        return _b64.b64encode(data).decode("ascii")

    _b64decode: Callable[[str], bytes] = _b64.b64decode
except ImportError:  # pragma: no cover - exercised in the client-only venv test

    def _b64encode(data: bytes) -> str:
        return binascii.b2a_base64(data, newline=False).decode("ascii")

    def _b64decode(text: str) -> bytes:
        return binascii.a2b_base64(text)


try:
    import orjson

    def dumps(obj: Any) -> bytes:
        """JSON bytes of a request body."""
        return orjson.dumps(obj)

    def loads(data: bytes) -> Any:
        """A JSON body (raises ``ValueError`` when it is not JSON)."""
        return orjson.loads(data)
except ImportError:  # pragma: no cover - exercised in the client-only venv test

    def dumps(obj: Any) -> bytes:
        """JSON bytes of a request body."""
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    def loads(data: bytes) -> Any:
        """A JSON body (raises ``ValueError`` when it is not JSON)."""
        return json.loads(data)


_WIRE_FLOATS = {2: "float16", 4: "float32", 8: "float64"}


def encode_tensor(array: npt.ArrayLike) -> dict[str, Any]:
    """The ``b64`` wire form of an array: float16/32/64 and bool keep their dtype, anything else is sent
    as float64 (integers, nested lists).
    """
    a = np.asarray(array)
    if a.dtype == np.bool_:
        name = "bool"
    elif a.dtype.kind == "f" and a.dtype.itemsize in _WIRE_FLOATS:
        name = _WIRE_FLOATS[a.dtype.itemsize]
    else:
        a, name = a.astype(np.float64), "float64"
    if a.dtype != np.bool_:
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    a = np.ascontiguousarray(a)
    return {"shape": list(a.shape), "dtype": name, "b64": _b64encode(a.tobytes())}


def decode_tensor(value: Any, dtype: npt.DTypeLike = np.float64) -> npt.NDArray[Any]:
    """A response tensor as a writable numpy array: the ``b64`` form keeps its dtype; a nested JSON
    list becomes ``dtype`` (``null``, a masked score, becomes ``-inf``).
    """
    if isinstance(value, dict):
        name = value["dtype"]
        wire = np.dtype(np.bool_) if name == "bool" else np.dtype(name).newbyteorder("<")
        out = np.frombuffer(bytearray(_b64decode(value["b64"])), dtype=wire).reshape(value["shape"])
        return out if wire == np.bool_ else out.astype(wire.newbyteorder("="), copy=False)
    if np.dtype(dtype).kind == "f":
        return np.array(_nulls_as_neg_inf(value), dtype=dtype)
    return np.array(value, dtype=dtype)


def _nulls_as_neg_inf(value: Any) -> Any:
    if value is None:
        return -np.inf
    if isinstance(value, list):
        return [_nulls_as_neg_inf(v) for v in value]
    return value
