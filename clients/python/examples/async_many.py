"""Many attention requests at once with the async client (one connection pool, retries on 503).

python async_many.py [URL]
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
from attention_client import AsyncAttentionClient, RetryPolicy


async def main(url: str) -> None:
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((2, 8, 32), dtype=np.float32) for _ in range(16)]
    async with AsyncAttentionClient(url, retry=RetryPolicy(max_retries=5)) as client:
        results = await asyncio.gather(*(client.attention(x, x, x, returns=["output"]) for x in batches))
    assert all(r.output is not None and r.output.shape == (2, 8, 32) for r in results)
    print(f"{len(results)} answers, distinct request ids: {len({r.request_id for r in results})}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"))
