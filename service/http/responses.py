"""Writing the REST front end's answers: JSON serialized with orjson straight from numpy, and gzip for the clients
that accept it.

FastAPI's default path (jsonable_encoder + json.dumps) is about 20x slower than orjson on large arrays, so the
routes answer with bytes serialized straight from numpy (:func:`json_bytes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def plain(obj: Any) -> Any:
    """What orjson's numpy path skips: 0-d and non-contiguous arrays, numpy scalars."""
    if isinstance(obj, np.ndarray | np.generic):
        return obj.tolist()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


class GZipIfAccepted(GZipMiddleware):
    """Starlette's GZipMiddleware, out of the way of clients that do not accept gzip.

    Starlette wraps every response, compressed or not (to add ``Vary:
    Accept-Encoding``), which costs tens of microseconds a request and a
    byte-wise comparison of large bodies; the API's POST answers are not
    cached, so requests without gzip in ``Accept-Encoding`` go straight through.
    Compressed answers keep their other headers: ``Inference-Header-Content-Length``
    still counts the JSON of the uncompressed body, as Triton does.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"accept-encoding" and b"gzip" in value:
                    await super().__call__(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def json_bytes(content: Any) -> bytes:
    """Serialize with orjson (numpy arrays natively; NaN and infinities become null)."""
    return orjson.dumps(content, option=JSON_OPTIONS, default=plain)


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON answer serialized with :func:`json_bytes`."""
    return Response(json_bytes(content), status_code=status_code, media_type="application/json", headers=headers)
