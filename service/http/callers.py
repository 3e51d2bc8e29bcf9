"""Who a REST request is, for what it owns (its attention sessions): the fingerprint of the API key it presents
(:func:`~service.dataplane.auth.caller_of`), read from the same headers the edge checked.
"""

from __future__ import annotations

from starlette.requests import Request

from service.dataplane.auth import caller_of, presented_key
from service.dataplane.plane import DataPlane


def request_caller(plane: DataPlane, request: Request) -> str:
    """The caller of ``request`` ("" without API keys)."""
    if plane.api_keys is None:
        return ""
    headers = request.headers
    return caller_of(plane.api_keys, presented_key(headers.get("authorization"), headers.get("x-api-key")))
