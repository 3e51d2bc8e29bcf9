"""What a refused request looks like: one exception hierarchy with the problem+json fields.

python errors.py [URL]
"""

from __future__ import annotations

import sys

import numpy as np
from attention_client import AttentionClient, ServiceError, TransportError, ValidationError


def main(url: str) -> None:
    with AttentionClient(url) as client:
        try:
            client.attention(np.ones((2, 4)), np.ones((2, 3)), np.ones((2, 3)))  # head dims 4 and 3 differ
        except ValidationError as e:
            print(f"{type(e).__name__} {e.status}: {e.detail}")
            print("fields:", [err["loc"] for err in e.errors], "request id:", e.request_id)
    with AttentionClient("http://127.0.0.1:9", timeout=2.0) as nowhere:  # nothing listens on port 9
        try:
            nowhere.softmax([1.0, 2.0])
        except TransportError as e:
            print(f"{type(e).__name__}: no answer (is a ServiceError: {isinstance(e, ServiceError)})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
