"""Against a running service: the computing commands through the Python client (the ``attention-client``
distribution, the server's ``client`` extra). Importing this module fails with ImportError without it.
"""

from __future__ import annotations

import os
from typing import Any

from attention_client import API_KEY_ENV, AttentionClient

from service.cli.args import URL_ENV

DEFAULT_URL = "http://127.0.0.1:8000"


def call(method: str, fields: dict[str, Any], *, url: str | None, timeout: float) -> tuple[dict[str, Any], str | None]:
    """``client.<method>`` with the request's fields (the API's names; ``return`` is the client's ``returns``):
    the answer as the service sent it, and its request id. Raises the client's ``ServiceError``.
    """
    kwargs = {("returns" if name == "return" else name): value for name, value in fields.items() if value is not None}
    address = url or os.environ.get(URL_ENV) or DEFAULT_URL
    with AttentionClient(address, api_key=os.environ.get(API_KEY_ENV) or None, timeout=timeout) as client:
        result = getattr(client, method)(**kwargs)
    return result.raw, result.request_id
